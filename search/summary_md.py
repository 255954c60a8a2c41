"""The study report on disk: the figures of `search.trial_plots` and `search.parameter_plots`
as PNG files and `summary.md`, which names the chosen engine, the leaders and what each figure
shows, next to the study's storage (`studies/<name>/` by default). Written by
`python -m search report` and at the end of run.sh.
"""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

from search import parameter_plots, plots, trial_plots
from search.records import Record
from search.report import top_table
from search.select import rank
from search.study import load_records

log = logging.getLogger(__name__)

MIN_TRIALS_FOR_IMPORTANCE = 4


def default_report_dir(url: str, study_name: str, studies_dir: str | Path = "studies") -> Path:
    """`<dir of the SQLite file or journal>/<study>/`, else (a database server)
    `<studies_dir>/<study>/`."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", study_name)
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///") :]).parent / safe
    if url.startswith("journal:") or "://" not in url:
        return Path(re.sub(r"^journal:(//)?", "", url)).parent / safe
    return Path(studies_dir) / safe


def param_importances(study: optuna.Study) -> tuple[dict[str, float], str]:
    """Importances for tokens/s over the feasible complete trials, or ({}, why not)."""
    records = {r.number: r for r in load_records(study)}
    trials = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.params and records[t.number].feasible
    ]
    if len(trials) < MIN_TRIALS_FOR_IMPORTANCE:
        return {}, (
            f"only {len(trials)} feasible complete trial(s) with parameters; importances need "
            f"at least {MIN_TRIALS_FOR_IMPORTANCE}"
        )
    # A copy holding only the feasible trials: an infeasible trial's 0 tokens/s says it was
    # wrong, not slow, and would dominate the variance.
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    copy = optuna.create_study(directions=study.directions)
    optuna.logging.set_verbosity(verbosity)
    copy.add_trials(trials)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values = optuna.importance.get_param_importances(copy, target=lambda t: t.values[0])
    except Exception as exc:  # e.g. no parameter common to all trials
        return {}, f"importances could not be computed: {exc}"
    if not values:
        return {}, "no parameter is shared by all feasible trials"
    return dict(values), f"from {len(trials)} feasible complete trials (fANOVA)"


def write_report(
    study: optuna.Study, out_dir: Path, top: int = 5, sweep_path: Path | None = None
) -> list[Path]:
    """Write the PNG figures and summary.md into `out_dir`; return the written paths. The shape
    sweep (`python -m search sweep`) at `sweep_path`, default `out_dir/sweep.json` when there,
    adds decode_vs_batch.png and prefill_vs_length.png."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = load_records(study)
    ranked = rank(records)
    best = study.user_attrs.get("verified_best") or {}
    chosen = best.get("trial")
    importances, why = param_importances(study)

    figures = {
        "tradeoff.png": (
            trial_plots.tradeoff_figure(records, chosen),
            "throughput vs peak memory of the feasible trials, the Pareto front and the chosen "
            "engine",
        ),
        "axis_effects.png": (
            parameter_plots.axis_effects_figure(records),
            "tokens/s by choice on each variant axis that varies",
        ),
        "history.png": (
            trial_plots.history_figure(records),
            "tokens/s per trial and the best so far",
        ),
        "floor_efficiency.png": (
            trial_plots.floor_figure(ranked, top),
            "floor efficiency per trace of the top assemblies",
        ),
        "importances.png": (
            parameter_plots.importance_figure(importances),
            f"parameter importances for tokens/s ({why})",
        ),
    }
    written, lines, missing = [], [], []
    for name, (fig, caption) in figures.items():
        if fig is None:
            missing.append(f"- `{name}`: not drawn ({_why_missing(name, why)})")
            continue
        written.append(plots.save(fig, out_dir / name))
        lines.append(f"- [`{name}`]({name}): {caption}")
    paths, sweep_lines = _sweep_figures(out_dir, sweep_path)
    written += paths
    lines += sweep_lines

    md = out_dir / "summary.md"
    md.write_text(_markdown(study, records, ranked, best, lines, missing, top))
    written.append(md)
    return written


def _sweep_figures(out_dir: Path, sweep_path: Path | None) -> tuple[list[Path], list[str]]:
    """The shape-sweep PNGs and their summary lines, when a sweep JSON is there."""
    from search import sweep_plots

    path = Path(sweep_path) if sweep_path else out_dir / "sweep.json"
    if sweep_path is None and not path.is_file():
        return [], []
    sweep = sweep_plots.load_sweep(path)
    if sweep is None:
        return [], [f"- shape sweep: `{path}` could not be read"]
    drawn = sweep_plots.write_sweep_figures(sweep, out_dir)
    source = f"measured by `python -m search sweep` on {sweep_plots.where(sweep)} (`{path.name}`)"
    lines = [f"- [`{p.name}`]({p.name}): {caption}, {source}" for p, caption in drawn]
    if not drawn:
        lines = [f"- shape sweep `{path.name}`: no measured point to draw"]
    return [p for p, _ in drawn], lines


def _why_missing(name: str, why_importance: str) -> str:
    return {
        "tradeoff.png": "no feasible trial",
        "axis_effects.png": "no variant axis takes two values among the feasible trials",
        "history.png": "no finished trial",
        "floor_efficiency.png": "the trials carry no floor_eff_<trace> numbers",
        "importances.png": why_importance,
    }[name]


def _markdown(study, records: list[Record], ranked, best: dict, figs, missing, top: int) -> str:
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    status = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    parts = [f"# Study `{study.study_name}`", "", f"{len(records)} trials: {status}.", ""]
    if best:
        parts += [
            f"**Chosen engine:** trial {best['trial']} `{best['variant_name']}`, "
            f"{best['tokens_per_s']:,.1f} tokens/s, peak {best.get('peak_mib', 0):,.0f} MiB "
            f"(verified {best.get('verified_at', '?')}).",
        ]
    elif ranked:
        parts += [
            f"**No verified best stored;** the leader is trial {ranked[0].number} "
            f"`{ranked[0].name}` ({ranked[0].tokens_per_s:,.1f} tokens/s).",
        ]
    else:
        parts += ["**No correct trial.**"]
    front = trial_plots.pareto_front(plots.feasible(records))
    if front:
        parts += ["", "Pareto front of the screening numbers (least memory first):", ""]
        parts += [
            f"- trial {r.number} `{r.name}`: {r.screening_tokens_per_s:,.1f} tokens/s, "
            f"{float(r.attrs.get('peak_mib') or 0):,.0f} MiB"
            for r in front
        ]
    parts += ["", f"## Top {top}", "", "```", top_table(ranked, top), "```", "", "## Figures", ""]
    parts += figs + missing
    return "\n".join(parts) + "\n"
