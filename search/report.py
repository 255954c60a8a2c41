"""What a run leaves for people: `workspace/results.log` (what was searched, what every trial did,
what won and why), the study report on disk (PNG figures and `summary.md` next to the study's
storage, `studies/<name>/` by default), and the commands that read a stored study back: `report`
(tables and the report) and `render` (one trial's engine file). Plain text for people; the study
storage is the data (open it with the dashboard command at the end of the log).

The figures are bare matplotlib Figures (drawn by Agg when saved, no display or pyplot backend
involved), each None when the records hold nothing to draw; `report` and tradeoffs.ipynb share
them.
"""

from __future__ import annotations

import io
import json
import logging
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import optuna
from matplotlib.figure import Figure
from optuna.trial import TrialState

from search.setup import ENGINES_ALIVE, UserError
from search.study import dashboard_command, load_records, locate_study, storage_file
from search.trial import OBJECTIVE_TRACES, Record, load_renderer, write_atomic
from search.write import Attempt, installed, rank
from variants.registry import AXES_BY_NAME
from variants.variant import Variant

log = logging.getLogger(__name__)


# --- plain-text tables (`report` and results.log) --------------------------------------------


def _num(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and abs(value) >= 1e4:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else str(value)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True))
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)]).rstrip()


def trace_names(records: list[Record]) -> list[str]:
    """Traces measured in any record, the objective's order first."""
    names = {name for r in records for name in r.trace_numbers()}
    names |= {name for r in records for name in r.trace_numbers("full_")}
    known = [n for n in OBJECTIVE_TRACES if n in names]
    return known + sorted(names - set(known))


def top_table(ranked: list[Record], n: int = 5) -> str:
    """The leaders in rank order: screening and full-protocol throughput in their own columns,
    the peak, and tokens/s per trace (full-protocol numbers where measured)."""
    if not ranked:
        return "(no correct trial)"
    traces = trace_names(ranked)
    header = ["rank", "trial", "variant", "screening tok/s", "full tok/s", "grader peak MiB"]
    header += [f"{t} tok/s" for t in traces] + ["max err", "tol share"]
    rows = []
    for i, r in enumerate(ranked[:n], 1):
        per = r.trace_numbers("full_" if r.has_full else "")
        full = r.attrs.get("full_tokens_per_s")
        row = [str(i), str(r.number), r.name, _num(r.screening_tokens_per_s), _num(full)]
        row.append(_num(r.peak_mib, 0))
        row += [_num(per.get(t, {}).get("tps")) for t in traces]
        err = r.attrs.get("max_abs_err")
        row += ["-" if err is None else f"{err:.3g}", _num(r.attrs.get("tol_share"), 3)]
        rows.append(row)
    return _table(header, rows)


def trace_table(record: Record) -> str:
    """Per trace: tokens/s, decode tokens/s, floor efficiency, seconds (quick and full)."""
    rows = []
    for prefix, label in (("", "quick"), ("full_", "full")):
        numbers = record.trace_numbers(prefix)
        for name in trace_names([record]):
            if name not in numbers:
                continue
            t = numbers[name]
            rows.append(
                [
                    name,
                    label,
                    _num(t.get("tps")),
                    _num(t.get("decode_tps")),
                    _num(t.get("floor_eff"), 3),
                    _num(t.get("seconds"), 4),
                ]
            )
    if not rows:
        return "(no measurements)"
    header = ["trace", "protocol", "tok/s", "decode tok/s", "floor eff", "seconds"]
    return _table(header, rows)


def trial_line(r: Record) -> str:
    """One trial: variant, status, error and tolerance, throughput per trace, or the reason."""
    head = f"#{r.number:<3d} {r.status:<10s} {r.name}"
    a = r.attrs
    err = ""
    if a.get("max_abs_err") is not None:
        err = (
            f" | max err {a['max_abs_err']:.3g} ({a.get('gate', 'course')} gate; tol share "
            f"{_num(a.get('tol_share'), 3)} of atol {a.get('atol')} rtol {a.get('rtol')}, noise "
            f"share {_num(a.get('noise_share'), 3)})"
        )
    if a.get("duplicate_of") is not None:
        head += f" (same variant as #{a['duplicate_of']})"
    if r.status in ("ok", "duplicate") and r.values:
        per = r.trace_numbers()
        traces = ", ".join(
            f"{n} {_num(per[n].get('tps'))}/{_num(per[n].get('decode_tps'))}"
            f" eff {_num(per[n].get('floor_eff'), 3)}"
            for n in trace_names([r])
            if n in per
        )
        peak = f"peak {_num(a.get('peak_mib'), 0)} MiB"
        if a.get("engine_peak_mib") is not None:  # the peak is the grader's pattern's
            peak = (
                f"peak {_num(a.get('peak_mib'), 0)} MiB in the grader's pattern "
                f"({_num(a.get('engine_peak_mib'), 0)} one engine)"
            )
        body = (
            f" | {_num(a.get('tokens_per_s'))} tok/s gmean, {peak},"
            f" create {_num(a.get('create_s'), 2)} s | tok/s/decode tok/s per trace: {traces}"
        )
        if r.has_full:
            body += f" | full protocol {_num(a.get('full_tokens_per_s'))} tok/s"
        return head + err + body
    if r.status == "waiting":
        return head + " (queued, not run)"
    if r.status == "running":
        return head + " (still running, or its process died)"
    reason = (a.get("reason") or a.get("full_reason") or "").strip().splitlines()
    first = reason[0] if reason else ""
    return head + err + (f" | {first}" if first else "")


def failure_details(records: list[Record]) -> str:
    """The tail of each failed trial's output (the reason is long; it goes last in the log)."""
    parts = []
    for r in records:
        reason = (r.attrs.get("reason") or "").strip()
        if r.status in ("failed", "infeasible") and reason and r.attrs.get("duplicate_of") is None:
            parts.append(f"--- trial {r.number} ({r.name}, {r.status}) ---\n{reason}")
    return "\n".join(parts) or "(none)"


def status_counts(records: list[Record]) -> str:
    """`failed 1, ok 20, ...`: how many trials ended in each status."""
    counts = Counter(r.status for r in records)
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def summary(records: list[Record], ranked: list[Record], n: int = 5) -> str:
    status = status_counts(records)
    parts = [f"{len(records)} trials: {status}", "", f"Top {n}:", top_table(ranked, n)]
    if ranked:
        parts += ["", f"Per trace, trial {ranked[0].number} ({ranked[0].name}):"]
        parts.append(trace_table(ranked[0]))
    return "\n".join(parts)


# --- workspace/results.log -------------------------------------------------------------------


@dataclass
class RunSummary:
    command: str
    environment: dict
    target: dict  # config path, weight dir, the config itself, notes
    capabilities: dict
    space: list[tuple[str, tuple]]
    space_size: int
    records: list[Record]
    ranked: list[Record]
    attempts: list[Attempt]
    phases: dict[str, float]
    storage: str | None = None
    study: str | None = None
    dashboard: str | None = None
    notes: list[str] = field(default_factory=list)


def _section(title: str, body: str) -> str:
    return f"== {title} ==\n{body.rstrip()}\n"


RANKING = (
    "Ranking: correct trials only (within half the tolerance), one per assembly; the leaders "
    "re-measured with the grader's full protocol first, by those numbers, then the others by "
    "their screening numbers; within 1 % the smaller peak memory first. The first that passes "
    "verification is written."
)


def _compare(chosen: Record, other: Record) -> tuple[float, float, str]:
    """Both trials' throughput from one protocol: the full one when both have it."""
    if chosen.has_full and other.has_full:
        return chosen.tokens_per_s, other.tokens_per_s, "full protocol"
    return chosen.screening_tokens_per_s, other.screening_tokens_per_s, "screening"


def _why(chosen: Record, ranked: list[Record]) -> str:
    if chosen.number < 0:
        return (
            f"{chosen.name}: a ranked default that was not measured here; no measured trial "
            "passed verification, so the safest default that passes it was written."
        )
    protocol = "full protocol" if chosen.has_full else "screening"
    text = (
        f"{chosen.name} (trial {chosen.number}): {chosen.tokens_per_s:.1f} tokens/s "
        f"(geometric mean, {protocol}), peak {chosen.peak_mib:.0f} MiB, "
        f"max error {chosen.attrs.get('max_abs_err', float('nan')):.3g} "
        f"({chosen.attrs.get('tol_share', float('nan')):.2f} of the tolerance)."
    )
    others = [r for r in ranked if r.number != chosen.number]
    if not others:
        return text + "\nIt was the only correct candidate.\n" + RANKING
    up = others[0]
    mine, theirs, protocol = _compare(chosen, up)
    ratio = mine / theirs if theirs else float("inf")
    text += (
        f"\nRunner-up: {up.name} (trial {up.number}): {theirs:.1f} against {mine:.1f} tokens/s "
        f"({protocol}, both), peak {up.peak_mib:.0f} MiB: the chosen one is {ratio:.3f}x its "
        "throughput"
    )
    if abs(ratio - 1) < 0.01:
        text += " (a tie within 1 %: the smaller peak memory decided)"
    text += "."
    if ranked and ranked[0].number != chosen.number:
        text += "\nHigher-ranked trial(s) failed verification: see below."
    return text + "\n" + RANKING


def _verification(attempts: list[Attempt]) -> str:
    if not attempts:
        return "(nothing was verified)"
    parts = []
    for a in attempts:
        head = f"-- trial {a.record.number} {a.record.name}: "
        if a.verification is None:
            parts.append(head + (a.error or "not verified"))
            continue
        v = a.verification
        head += f"{'PASSED' if v.passed else 'FAILED'} in {v.seconds:.1f} s ({'; '.join(v.steps)})"
        parts.append(f"{head}\n{v.output}")
    return "\n".join(parts)


def render_log(s: RunSummary) -> str:
    out = [f"# results of: {s.command}\n"]
    out.append(_section("environment", "\n".join(f"{k}: {v}" for k, v in s.environment.items())))
    target = dict(s.target)
    config = target.pop("config", {})
    body = "\n".join(f"{k}: {v}" for k, v in target.items())
    out.append(_section("target", body + "\nconfig: " + json.dumps(config, sort_keys=True)))
    space = "\n".join(f"{name}: {', '.join(str(c) for c in choices)}" for name, choices in s.space)
    space += f"\n({s.space_size} assemblies; capabilities: {json.dumps(s.capabilities)})"
    out.append(_section("search space (axes and the choices offered here)", space))
    if s.notes:
        out.append(_section("notes", "\n".join(s.notes)))
    trials = "\n".join(trial_line(r) for r in sorted(s.records, key=lambda r: r.number))
    out.append(_section(f"trials ({len(s.records)})", trials or "(none)"))
    out.append(_section("top 5", top_table(s.ranked, 5)))
    done = installed(s.attempts)
    if done is not None:
        chosen = done.record
        body = _why(chosen, s.ranked) + "\nvariant: " + json.dumps(chosen.variant, sort_keys=True)
        body += "\n\n" + trace_table(chosen)
        out.append(_section("chosen", body))
    else:
        out.append(
            _section("chosen", "NONE: no candidate passed verification; engine.py untouched")
        )
    out.append(_section("verification", _verification(s.attempts)))
    phases = "\n".join(f"{name}: {secs:.1f} s" for name, secs in s.phases.items())
    out.append(_section("time per phase", phases))
    if s.storage:
        where = f"storage: {s.storage}\nstudy: {s.study}"
        out.append(_section("study", f"{where}\ndashboard: {s.dashboard}"))
    out.append(_section("failure details", failure_details(s.records)))
    return "\n".join(out)


def write_log(path: Path, summary: RunSummary) -> None:
    write_atomic(path, render_log(summary))


# --- the study report on disk: figures and summary.md ----------------------------------------


MIN_TRIALS_FOR_IMPORTANCE = 4


def default_report_dir(url: str, study_name: str, studies_dir: str | Path = "studies") -> Path:
    """`<dir of the SQLite file or journal>/<study>/`, else (a database server)
    `<studies_dir>/<study>/`."""
    path = storage_file(url)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", study_name)
    return (path.parent if path else Path(studies_dir)) / safe


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
            tradeoff_figure(records, chosen),
            "throughput vs peak memory of the feasible trials, the Pareto front and the chosen "
            "engine",
        ),
        "axis_effects.png": (
            axis_effects_figure(records),
            "tokens/s by choice on each variant axis that varies",
        ),
        "history.png": (history_figure(records), "tokens/s per trial and the best so far"),
        "floor_efficiency.png": (
            floor_figure(ranked, top),
            "floor efficiency per trace of the top assemblies",
        ),
        "importances.png": (
            importance_figure(importances),
            f"parameter importances for tokens/s ({why})",
        ),
    }
    written, lines, missing = [], [], []
    for name, (fig, caption) in figures.items():
        if fig is None:
            missing.append(f"- `{name}`: not drawn ({_why_missing(name, why)})")
            continue
        written.append(save(fig, out_dir / name))
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
    from sweep import plots as sweep_plots

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
    status = status_counts(records)
    parts = [f"# Study `{study.study_name}`", "", f"{len(records)} trials: {status}.", ""]
    if best:
        parts += [
            f"**Chosen engine:** trial {best['trial']} `{best['variant_name']}`, "
            f"{best['tokens_per_s']:,.1f} tokens/s, peak {best.get('peak_mib', 0):,.0f} MiB "
            f"(verified {best.get('verified_at', '?')})."
        ]
    elif ranked:
        parts += [
            f"**No verified best stored;** the leader is trial {ranked[0].number} "
            f"`{ranked[0].name}` ({ranked[0].tokens_per_s:,.1f} tokens/s)."
        ]
    else:
        parts += ["**No correct trial.**"]
    front = pareto_front(feasible(records))
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


# --- the figures -----------------------------------------------------------------------------


STYLE = {
    "font.size": 12,
    "axes.titlesize": 14,
    "axes.labelsize": 12,
    "xtick.labelsize": 11,
    "ytick.labelsize": 11,
    "legend.fontsize": 11,
    "figure.dpi": 100,
}


def bare_figure(width: float, height: float, **kwargs):
    """A bare Figure, not registered with pyplot: no backend is switched and nothing leaks when
    many are drawn; callers hold STYLE (rc_context) while they draw."""
    fig = Figure(figsize=(width, height))
    return fig, fig.subplots(**kwargs)


def feasible(records: list[Record]) -> list[Record]:
    return [r for r in records if r.feasible and r.tokens_per_s > 0]


def save(fig: Figure, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (for IPython.display.Image in notebooks)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


CHOSEN_COLOR = "tab:red"


def _tps(r: Record) -> float:
    """The screening throughput: every measured trial has one, from the same protocol."""
    return r.screening_tokens_per_s


def _peak(r: Record) -> float:
    return float(r.attrs.get("peak_mib") or 0.0)


def pareto_front(records: list[Record]) -> list[Record]:
    """Records no other beats on both screening objectives (more tokens/s, less peak MiB), by
    memory."""
    front = []
    for r in sorted(records, key=lambda r: (_peak(r), -_tps(r))):
        if not front or _tps(r) > _tps(front[-1]):
            front.append(r)
    return front


def tradeoff_figure(records: list[Record], chosen: int | None = None) -> Figure | None:
    """Throughput against peak memory of every feasible trial, the front and the chosen engine,
    all by their screening numbers (one protocol for every point)."""
    points = feasible(records)
    if not points:
        return None
    with matplotlib.rc_context(STYLE):
        fig, ax = bare_figure(10, 6.5)
        ax.scatter(
            [_peak(r) for r in points],
            [_tps(r) for r in points],
            s=45,
            alpha=0.6,
            color="tab:blue",
            label=f"feasible trials ({len(points)})",
        )
        front = pareto_front(points)
        ax.plot(
            [_peak(r) for r in front],
            [_tps(r) for r in front],
            "-o",
            color="tab:orange",
            lw=2,
            ms=7,
            drawstyle="steps-post",
            label="Pareto front",
        )
        pick = next((r for r in points if r.number == chosen), None)
        if pick is not None:
            xs = [_peak(r) for r in points]
            right = _peak(pick) > (min(xs) + max(xs)) / 2  # label to the left, inside the axes
            ax.scatter(
                [_peak(pick)],
                [_tps(pick)],
                s=260,
                marker="*",
                color=CHOSEN_COLOR,
                zorder=5,
                label="chosen engine",
            )
            ax.annotate(
                f"#{pick.number} {pick.name}\n{_tps(pick):,.1f} tok/s, {_peak(pick):,.0f} MiB",
                (_peak(pick), _tps(pick)),
                xytext=(-12 if right else 12, -28),
                textcoords="offset points",
                ha="right" if right else "left",
                fontsize=10,
                color=CHOSEN_COLOR,
                bbox={"boxstyle": "round", "fc": "white", "ec": CHOSEN_COLOR, "alpha": 0.9},
            )
        ax.set_xlabel("peak memory in the grader's pattern (MiB, screening)")
        ax.set_ylabel("throughput (tokens/s, geometric mean over traces, screening)")
        ax.set_ylim(bottom=0)
        ax.set_title("Throughput vs peak memory of the feasible trials")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")  # y starts at 0: the space under the trials is empty
        fig.tight_layout()
    return fig


def history_figure(records: list[Record]) -> Figure | None:
    """Tokens/s per trial number (infeasible and failed at zero) and the best so far."""
    done = [r for r in records if r.status not in ("running", "waiting")]
    done.sort(key=lambda r: r.number)
    if not done:
        return None
    with matplotlib.rc_context(STYLE):
        fig, ax = bare_figure(10, 5.5)
        ok = [r for r in done if r.feasible]
        bad = [r for r in done if not r.feasible]
        ax.scatter(
            [r.number for r in ok],
            [r.tokens_per_s for r in ok],
            s=40,
            color="tab:blue",
            label="feasible",
        )
        ax.scatter(
            [r.number for r in bad],
            [0] * len(bad),
            s=40,
            marker="x",
            color="tab:gray",
            label="infeasible / failed",
        )
        best, xs, ys = 0.0, [], []
        for r in done:
            if r.feasible:
                best = max(best, r.tokens_per_s)
            xs.append(r.number)
            ys.append(best)
        ax.step(xs, ys, where="post", color="tab:orange", lw=2, label="best so far")
        ax.set_xlabel("trial number")
        ax.set_ylabel("throughput (tokens/s)")
        ax.set_ylim(bottom=0)
        ax.set_title("Optimization history")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        fig.tight_layout()
    return fig


def floor_figure(ranked: list[Record], top: int = 5) -> Figure | None:
    """Floor efficiency (measured time against the roofline floor) per trace, top assemblies."""
    leaders = [r for r in ranked[:top] if _floor(r)]
    if not leaders:
        return None
    traces = sorted({t for r in leaders for t in _floor(r)})
    width = 0.8 / len(leaders)
    with matplotlib.rc_context(STYLE):
        fig, ax = bare_figure(max(10, 2.2 * len(traces)), 6)
        for i, r in enumerate(leaders):
            eff = _floor(r)
            xs = [k + (i - (len(leaders) - 1) / 2) * width for k in range(len(traces))]
            ax.bar(xs, [eff.get(t, 0.0) for t in traces], width, label=f"#{r.number} {r.name}")
        ax.set_xticks(range(len(traces)))
        ax.set_xticklabels(traces)
        ax.set_xlabel("trace")
        ax.set_ylabel("floor efficiency (floor time / measured time)")
        ax.set_title(f"Floor efficiency per trace, top {len(leaders)} assemblies")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, fontsize=10)
        fig.tight_layout()
    return fig


def _floor(r: Record) -> dict[str, float]:
    per = r.trace_numbers("full_" if r.has_full else "")
    out = {t: v["floor_eff"] for t, v in per.items() if v.get("floor_eff") is not None}
    if not out and r.has_full:
        per = r.trace_numbers()
        out = {t: v["floor_eff"] for t, v in per.items() if v.get("floor_eff") is not None}
    return out


# Axes of the Variant drawn in the per-axis figure, in registry order.
VARIANT_AXES = tuple(AXES_BY_NAME)  # every axis of the registry, in its order


def _applies(r: Record, axis: str) -> bool:
    """The trial chose on this axis (a slab trial has no block size, an eager one no mode)."""
    known = AXES_BY_NAME.get(axis)
    return bool(r.variant) and axis in r.variant and (known is None or known.applies(r.variant))


def varying_axes(records: list[Record]) -> list[str]:
    """Variant axes taking more than one value among the feasible trials."""
    out = []
    for axis in VARIANT_AXES:
        values = {str(r.variant.get(axis)) for r in records if _applies(r, axis)}
        if len(values) > 1:
            out.append(axis)
    return out


def axis_effects_figure(records: list[Record]) -> Figure | None:
    """Tokens/s by choice, one panel per axis that varies: a box per choice, the trials as dots."""
    points = [r for r in feasible(records) if r.variant]
    axes_names = varying_axes(points)
    if not axes_names:
        return None
    cols = min(3, len(axes_names))
    rows = -(-len(axes_names) // cols)
    with matplotlib.rc_context(STYLE):
        fig, grid = bare_figure(5.2 * cols, 4.3 * rows, nrows=rows, ncols=cols, squeeze=False)
        for ax, axis in zip(grid.flat, axes_names):
            chose = [r for r in points if _applies(r, axis)]
            choices = sorted({str(r.variant[axis]) for r in chose})
            groups = [[r.tokens_per_s for r in chose if str(r.variant[axis]) == c] for c in choices]
            ax.boxplot(groups, widths=0.5, showfliers=False)
            for i, ys in enumerate(groups, 1):
                xs = [i + 0.12 * ((j % 5) - 2) / 2 for j in range(len(ys))]
                ax.scatter(xs, ys, s=22, alpha=0.7, color="tab:blue", zorder=3)
            ax.set_xticks(range(1, len(choices) + 1))
            ax.set_xticklabels([f"{c}\n(n={len(g)})" for c, g in zip(choices, groups)])
            ax.set_title(axis)
            ax.set_ylabel("tokens/s")
            ax.grid(axis="y", alpha=0.3)
        for ax in list(grid.flat)[len(axes_names) :]:
            ax.set_visible(False)
        fig.suptitle("Throughput by choice on each variant axis (feasible trials)", fontsize=15)
        fig.tight_layout()
    return fig


def importance_figure(importances: dict[str, float]) -> Figure | None:
    """Horizontal bars: the share of the tokens/s variance each parameter explains."""
    if not importances:
        return None
    items = sorted(importances.items(), key=lambda kv: kv[1])
    with matplotlib.rc_context(STYLE):
        fig, ax = bare_figure(10, max(4, 0.6 * len(items) + 1.8))
        ax.barh([k for k, _ in items], [v for _, v in items], color="tab:green")
        for i, (_, v) in enumerate(items):
            ax.text(v, i, f" {v:.2f}", va="center", fontsize=11)
        ax.set_xlabel("importance for tokens/s (fANOVA share, sums to 1)")
        ax.set_ylabel("parameter")
        ax.set_title("Parameter importances")
        ax.set_xlim(0, max(v for _, v in items) * 1.2 or 1)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
    return fig


# --- `python -m search report` and `render` --------------------------------------------------


def report(args) -> int:
    study, url = locate_study(args.storage, args.study, args.studies_dir)
    records = load_records(study)
    print(f"study {study.study_name} in {url}")
    print(summary(records, rank(records), args.top))
    best = study.user_attrs.get("verified_best")
    if best:
        print(
            f"\nverified best: trial {best['trial']} {best['variant_name']} "
            f"({best['tokens_per_s']:.1f} tokens/s, verified {best['verified_at']})"
        )
    if args.all:
        print("\nAll trials:")
        for r in records:
            print(trial_line(r))
    if not getattr(args, "no_plots", False):
        out = (
            Path(args.out)
            if args.out
            else default_report_dir(url, study.study_name, args.studies_dir)
        )
        paths = write_report(study, out, args.top, getattr(args, "sweep", None))
        print(f"\nwrote {len(paths)} file(s) in {out}: " + ", ".join(p.name for p in paths))
    print(f"\ndashboard: {dashboard_command(url)}")
    return 0


def _pick(study, records: list[Record], number: int | None) -> Record:
    if number is None:
        best = study.user_attrs.get("verified_best")
        number = best["trial"] if best else None
    if number is None:
        ranked = rank(records)
        if not ranked:
            raise UserError("the study has no correct trial to render; run more trials")
        return ranked[0]
    for r in records:
        if r.number == number and r.variant:
            return r
    best = study.user_attrs.get("verified_best") or {}
    if best.get("trial") == number:
        return Record(number, "ok", best["variant"], {"variant_name": best["variant_name"]})
    raise UserError(f"trial {number} has no variant in study {study.study_name}; see `report`")


def render(args) -> int:
    study, _ = locate_study(args.storage, args.study, args.studies_dir)
    record = _pick(study, load_records(study), args.trial)
    variant = Variant.from_dict(record.variant)
    header = f"variant {variant.name} from study {study.study_name}, trial {record.number}"
    budget = study.user_attrs.get("memory_budget_gib")
    engine_budget = None if budget is None else budget / ENGINES_ALIVE
    path = load_renderer(args.renderer)(variant, Path(args.output), header, engine_budget)
    print(f"wrote {path or args.output}: trial {record.number} {variant.name}")
    print(json.dumps(variant.to_dict(), sort_keys=True))
    return 0
