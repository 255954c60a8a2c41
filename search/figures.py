"""The study report on disk: PNG figures and `summary.md` (the chosen engine, the Pareto front,
the leaders, what each figure shows) next to the study's storage (`studies/<name>/` by default),
written by `python -m search report` and at the end of run.sh; tradeoffs.ipynb shows the same
figures. Optuna's matplotlib plots draw the front, the history, the slices and the importances,
over an in-memory copy of the study whose one constraint is a Record's feasibility.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import matplotlib
import numpy as np
import optuna
from matplotlib.figure import Figure
from optuna.trial import TrialState
from optuna.visualization import matplotlib as plots

from search.report import beyond_presets, status_counts, top_table
from search.study import load_records
from search.trial import Record
from search.write import rank
from sweep import plots as sweep_plots
from sweep.plots import STYLE, save

MIN_TRIALS_FOR_IMPORTANCE = 4
TPS = "tokens/s (geometric mean over the traces, screening)"
MIB = "peak MiB with one engine alive (screening)"
# name: (its caption in summary.md, why it may not be drawn); {why}: param_importances' reason
CAPTIONS = {
    "tradeoff.png": (
        "throughput vs peak memory of the feasible trials, the Pareto front and the chosen engine",
        "no feasible trial",
    ),
    "axis_effects.png": (
        "tokens/s by choice on each parameter that varies",
        "no parameter takes two values among the feasible trials",
    ),
    "history.png": ("tokens/s per trial and the best so far", "no complete trial"),
    "floor_efficiency.png": (
        "floor efficiency per trace of the top assemblies",
        "the trials carry no floor_eff_<trace> numbers",
    ),
    "importances.png": ("parameter importances for tokens/s ({why})", "{why}"),
}


def write_report(
    study: optuna.Study, out_dir: Path, top: int = 5, sweep_path: Path | None = None
) -> list[Path]:
    """Write the PNG figures and summary.md into `out_dir`; return the written paths. The shape
    sweep (`python -m search sweep`) at `sweep_path`, default `out_dir/sweep.json` when there,
    adds decode_vs_batch.png and prefill_vs_length.png."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = load_records(study)
    importances, why = param_importances(study)
    figures = {
        "tradeoff.png": tradeoff_figure(study, records),
        "axis_effects.png": axis_effects_figure(study, records),
        "history.png": history_figure(study, records),
        "floor_efficiency.png": floor_figure(study, records, top),
        "importances.png": importance_figure(study, records) if importances else None,
    }
    written, lines, missing = [], [], []
    for name, fig in figures.items():
        caption, why_not = (text.format(why=why) for text in CAPTIONS[name])
        if fig is None:
            missing.append(f"- `{name}`: not drawn ({why_not})")
        else:
            written.append(save(fig, out_dir / name))
            lines.append(f"- [`{name}`]({name}): {caption}")
    paths, sweep_lines = _sweep_figures(out_dir, sweep_path)
    md = out_dir / "summary.md"
    md.write_text(_markdown(study, records, lines + sweep_lines + missing, top))
    return [*written, *paths, md]


def _sweep_figures(out_dir: Path, sweep_path: Path | None) -> tuple[list[Path], list[str]]:
    """The shape-sweep PNGs and their summary lines, when a sweep JSON is there."""
    path = Path(sweep_path) if sweep_path else out_dir / "sweep.json"
    if sweep_path is None and not path.is_file():
        return [], []
    sweep = sweep_plots.load_sweep(path)
    if sweep is None:
        return [], [f"- shape sweep: `{path}` could not be read"]
    drawn = sweep_plots.write_sweep_figures(sweep, out_dir)
    if not drawn:
        return [], [f"- shape sweep `{path.name}`: no measured point to draw"]
    source = f"measured by `python -m search sweep` on {sweep_plots.where(sweep)} (`{path.name}`)"
    return [p for p, _ in drawn], [f"- [`{p.name}`]({p.name}): {c}, {source}" for p, c in drawn]


def _markdown(study, records: list[Record], figures: list[str], top: int) -> str:
    ranked = rank(records)
    best = study.user_attrs.get("verified_best")
    if best:
        head = (
            f"**Chosen engine:** trial {best['trial']} `{best['variant_name']}`, "
            f"{best['tokens_per_s']:,.1f} tokens/s, peak {best.get('peak_mib', 0):,.0f} MiB "
            f"(verified {best.get('verified_at', '?')})."
        )
    elif ranked:
        head = (
            f"**No verified best stored;** the leader is trial {ranked[0].number} "
            f"`{ranked[0].name}` ({ranked[0].tokens_per_s:,.1f} tokens/s)."
        )
    else:
        head = "**No correct trial.**"
    parts = [
        f"# Study `{study.study_name}`",
        "",
        f"{len(records)} trials: {status_counts(records)}.",
    ]
    parts += ["", head]
    front = pareto_front(feasible(records))
    if front:
        parts += ["", "Pareto front of the screening numbers (least memory first):", ""]
        parts += [
            f"- trial {r.number} `{r.name}`: {r.screening_tokens_per_s:,.1f} tokens/s, "
            f"{_peak(r):,.0f} MiB"
            for r in front
        ]
    if ranked:
        story = beyond_presets(ranked[0], records).splitlines()
        parts += ["", "## Beyond the presets", "", *[f"- {line}" for line in story]]
    parts += ["", f"## Top {top}", "", "```", top_table(ranked, top), "```", "", "## Figures", ""]
    return "\n".join(parts + figures) + "\n"


# --- the figures: each a matplotlib Figure, or None when the records hold nothing to draw ------


def feasible(records: list[Record]) -> list[Record]:
    return [r for r in records if r.feasible and r.tokens_per_s > 0]


def _peak(r: Record) -> float:
    return float(r.attrs.get("peak_mib") or 0.0)


def pareto_front(records: list[Record]) -> list[Record]:
    """Records no other beats on both screening objectives (more tokens/s, less peak MiB), by
    memory."""
    front = []
    for r in sorted(records, key=lambda r: (_peak(r), -r.screening_tokens_per_s)):
        if not front or r.screening_tokens_per_s > front[-1].screening_tokens_per_s:
            front.append(r)
    return front


def trials_study(
    study: optuna.Study, records: list[Record], objectives: int = 1, feasible_only: bool = True
) -> optuna.Study:
    """In memory: the complete trials with their first `objectives` values (tokens/s, peak MiB)
    and Record.feasible as their constraint; with `feasible_only`, the feasible ones alone (an
    infeasible trial's 0 tokens/s says it was wrong, not slow). Every other trial stands in as a
    failed one, so that the trial numbers stay the study's."""
    ok = {r.number: r.feasible for r in records}
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    copy = optuna.create_study(directions=study.directions[:objectives])
    optuna.logging.set_verbosity(verbosity)
    for t in study.get_trials(deepcopy=False):
        feasible = ok.get(t.number, False)
        if t.state != TrialState.COMPLETE or not t.values or (feasible_only and not feasible):
            copy.add_trial(optuna.trial.create_trial(state=TrialState.FAIL))
            continue
        trial = optuna.trial.create_trial(
            params=t.params, distributions=t.distributions, values=t.values[:objectives]
        )
        trial.set_constraint("correctness", 0.0 if feasible else 1.0)
        copy.add_trial(trial)
    return copy


def _complete(study: optuna.Study) -> list:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def param_importances(study: optuna.Study) -> tuple[dict[str, float], str]:
    """Importances for tokens/s over the feasible complete trials (Optuna's default evaluator,
    PED-ANOVA), or ({}, why not)."""
    copy = trials_study(study, load_records(study))
    n = len(_complete(copy))
    if n < MIN_TRIALS_FOR_IMPORTANCE:
        return {}, (
            f"only {n} feasible complete trial(s) with parameters; importances need at least "
            f"{MIN_TRIALS_FOR_IMPORTANCE}"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values = optuna.importance.get_param_importances(copy)
    except Exception as exc:  # e.g. no parameter common to all trials
        return {}, f"importances could not be computed: {exc}"
    if not values:
        return {}, "no parameter is shared by all feasible trials"
    return dict(values), f"from {n} feasible complete trials (PED-ANOVA)"


def optuna_figure(plot, *args, size: tuple[float, float] | None = None, **kwargs) -> Figure:
    """A plot of optuna.visualization.matplotlib as a Figure closed to pyplot (no window, none
    left open); the ggplot style it switches to and its ExperimentalWarning stay inside."""
    import matplotlib.pyplot as plt

    with matplotlib.rc_context(), warnings.catch_warnings(), plt.ioff():
        warnings.simplefilter("ignore")  # ExperimentalWarning, and few-trial caveats
        fig = np.ravel(plot(*args, **kwargs))[0].figure
        plt.close(fig)
        if size is not None:
            fig.set_size_inches(*size)
        if len(fig.axes) == 1:  # (the slices' colorbar does not fit a tight layout)
            fig.set_layout_engine("tight")
        fig.draw_without_rendering()  # its ticks and grid lines take the style now
    return fig


def tradeoff_figure(study: optuna.Study, records: list[Record]) -> Figure | None:
    """Optuna's Pareto-front plot of the feasible trials (peak MiB, tokens/s: the screening
    numbers, one protocol for every point) and the chosen engine as a star."""
    copy = trials_study(study, records, objectives=2)
    if not _complete(copy):
        return None
    fig = optuna_figure(
        plots.plot_pareto_front,
        copy,
        target_names=[MIB, TPS],
        targets=lambda t: (t.values[1], t.values[0]),  # memory across, throughput up
        size=(10, 6.5),
    )
    ax = fig.axes[0]
    ax.set_title("Throughput vs peak memory of the feasible trials")
    chosen = (study.user_attrs.get("verified_best") or {}).get("trial")
    pick = next((r for r in feasible(records) if r.number == chosen), None)
    if pick is not None:
        label = f"chosen: #{pick.number} {pick.name}"
        xy = (_peak(pick), pick.screening_tokens_per_s)
        ax.scatter(*xy, s=260, marker="*", color="gold", edgecolors="black", zorder=5, label=label)
        ax.legend()
    return fig


def history_figure(study: optuna.Study, records: list[Record]) -> Figure | None:
    """Optuna's optimization history of tokens/s: every complete trial (the infeasible in gray,
    at 0) and the best feasible so far."""
    copy = trials_study(study, records, feasible_only=False)
    if not _complete(copy):
        return None
    return optuna_figure(plots.plot_optimization_history, copy, target_name="tokens/s")


def axis_effects_figure(study: optuna.Study, records: list[Record]) -> Figure | None:
    """Optuna's slice plot of tokens/s over each parameter that takes two values or more among
    the feasible trials."""
    copy = trials_study(study, records)
    seen: dict[str, set] = {}
    for t in _complete(copy):
        for name, value in t.params.items():
            seen.setdefault(name, set()).add(repr(value))
    varying = [name for name, values in seen.items() if len(values) > 1]
    if not varying:
        return None
    size = (max(6.4, 3.2 * len(varying)), 4.8)
    return optuna_figure(plots.plot_slice, copy, params=varying, target_name="tokens/s", size=size)


def importance_figure(study: optuna.Study, records: list[Record]) -> Figure | None:
    """Optuna's importance plot: the share of the tokens/s variance each parameter explains."""
    copy = trials_study(study, records)
    if len(_complete(copy)) < MIN_TRIALS_FOR_IMPORTANCE:
        return None
    return optuna_figure(plots.plot_param_importances, copy, target_name="tokens/s")


def floor_figure(study: optuna.Study, records: list[Record], top: int = 5) -> Figure | None:
    """Floor efficiency (the roofline floor's time over the measured time) per trace, a bar per
    top assembly."""
    leaders = [(r, _floor(r)) for r in rank(records)[:top]]
    leaders = [(r, eff) for r, eff in leaders if eff]
    if not leaders:
        return None
    traces = sorted({t for _, eff in leaders for t in eff})
    width = 0.8 / len(leaders)
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(max(10, 2.2 * len(traces)), 6), layout="tight")
        ax = fig.subplots()
        for i, (r, eff) in enumerate(leaders):
            xs = np.arange(len(traces)) + (i - (len(leaders) - 1) / 2) * width
            ax.bar(xs, [eff.get(t, 0.0) for t in traces], width, label=f"#{r.number} {r.name}")
        ax.set_xticks(range(len(traces)), traces)
        ax.set(xlabel="trace", ylabel="floor efficiency (floor time / measured time)")
        ax.set_title(f"Floor efficiency per trace, top {len(leaders)} assemblies")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=10)
    return fig


def _floor(r: Record) -> dict[str, float]:
    """Floor efficiency per trace: the full protocol's when measured, else the screening's."""
    for prefix in ("full_", "") if r.has_full else ("",):
        per = r.trace_numbers(prefix)
        out = {t: v["floor_eff"] for t, v in per.items() if v.get("floor_eff") is not None}
        if out:
            return out
    return {}


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (for IPython.display.Image in notebooks)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()
