"""The study report on disk: PNG figures and `summary.md` (the chosen engine, the leaders, what
each figure shows) next to the study's storage (`studies/<name>/` by default), written by
`python -m search report` and at the end of run.sh. The figures are bare matplotlib Figures
(drawn by Agg when saved, no display or pyplot backend involved), each None when the records hold
nothing to draw; `report` and tradeoffs.ipynb share them.
"""

from __future__ import annotations

import io
import warnings
from contextlib import contextmanager
from pathlib import Path

import matplotlib
import optuna
from matplotlib.figure import Figure
from optuna.trial import TrialState

from search.report import status_counts, top_table
from search.study import load_records
from search.trial import Record
from search.write import rank
from variants.registry import AXES_BY_NAME

MIN_TRIALS_FOR_IMPORTANCE = 4


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

    # name: (the figure or None, its caption, why it may not be drawn)
    figures = {
        "tradeoff.png": (
            tradeoff_figure(records, chosen),
            "throughput vs peak memory of the feasible trials, the Pareto front and the chosen "
            "engine",
            "no feasible trial",
        ),
        "axis_effects.png": (
            axis_effects_figure(records),
            "tokens/s by choice on each variant axis that varies",
            "no variant axis takes two values among the feasible trials",
        ),
        "history.png": (
            history_figure(records),
            "tokens/s per trial and the best so far",
            "no finished trial",
        ),
        "floor_efficiency.png": (
            floor_figure(ranked, top),
            "floor efficiency per trace of the top assemblies",
            "the trials carry no floor_eff_<trace> numbers",
        ),
        "importances.png": (
            importance_figure(importances),
            f"parameter importances for tokens/s ({why})",
            why,
        ),
    }
    written, lines, missing = [], [], []
    for name, (fig, caption, why_not) in figures.items():
        if fig is None:
            missing.append(f"- `{name}`: not drawn ({why_not})")
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
    if ranked:
        from search.report import beyond_presets

        story = beyond_presets(ranked[0], records).splitlines()
        parts += ["", "## Beyond the presets", "", *[f"- {line}" for line in story]]
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
CHOSEN_COLOR = "tab:red"


@contextmanager
def drawing(width: float, height: float, **subplots):
    """A bare Figure and its axes, drawn in STYLE and laid out tight at the end: not registered
    with pyplot, so no backend is switched and nothing leaks when many are drawn."""
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(width, height))
        yield fig, fig.subplots(**subplots)
        fig.tight_layout()


def _label(ax, title: str, x: str, y: str, grid: str = "both", **legend) -> None:
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title)
    ax.grid(axis=grid, alpha=0.3)
    if legend:
        ax.legend(**legend)


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


def tradeoff_figure(records: list[Record], chosen: int | None = None) -> Figure | None:
    """Throughput against peak memory of every feasible trial, the front and the chosen engine,
    all by their screening numbers (one protocol for every point)."""
    points = feasible(records)
    if not points:
        return None
    xs, ys = [_peak(r) for r in points], [r.screening_tokens_per_s for r in points]
    front = pareto_front(points)
    with drawing(10, 6.5) as (fig, ax):
        ax.scatter(xs, ys, s=45, alpha=0.6, color="tab:blue", label=f"feasible trials ({len(xs)})")
        ax.plot(
            [_peak(r) for r in front],
            [r.screening_tokens_per_s for r in front],
            "-o",
            color="tab:orange",
            lw=2,
            ms=7,
            drawstyle="steps-post",
            label="Pareto front",
        )
        pick = next((r for r in points if r.number == chosen), None)
        if pick is not None:
            x, y = _peak(pick), pick.screening_tokens_per_s
            right = x > (min(xs) + max(xs)) / 2  # label to the left, inside the axes
            ax.scatter(
                [x], [y], s=260, marker="*", color=CHOSEN_COLOR, zorder=5, label="chosen engine"
            )
            ax.annotate(
                f"#{pick.number} {pick.name}\n{y:,.1f} tok/s, {x:,.0f} MiB",
                (x, y),
                xytext=(-12 if right else 12, -28),
                textcoords="offset points",
                ha="right" if right else "left",
                fontsize=10,
                color=CHOSEN_COLOR,
                bbox={"boxstyle": "round", "fc": "white", "ec": CHOSEN_COLOR, "alpha": 0.9},
            )
        ax.set_ylim(bottom=0)
        _label(
            ax,
            "Throughput vs peak memory of the feasible trials",
            "peak memory in the grader's pattern (MiB, screening)",
            "throughput (tokens/s, geometric mean over traces, screening)",
            loc="lower right",  # y starts at 0: the space under the trials is empty
        )
    return fig


def history_figure(records: list[Record]) -> Figure | None:
    """Tokens/s per trial number (infeasible and failed at zero) and the best so far."""
    done = [r for r in records if r.status not in ("running", "waiting")]
    done.sort(key=lambda r: r.number)
    if not done:
        return None
    ok = [r for r in done if r.feasible]
    bad = [r for r in done if not r.feasible]
    best, xs, ys = 0.0, [], []
    for r in done:
        if r.feasible:
            best = max(best, r.tokens_per_s)
        xs.append(r.number)
        ys.append(best)
    with drawing(10, 5.5) as (fig, ax):
        oks = [r.number for r in ok], [r.tokens_per_s for r in ok]
        ax.scatter(*oks, s=40, color="tab:blue", label="feasible")
        ax.scatter(
            [r.number for r in bad],
            [0] * len(bad),
            s=40,
            marker="x",
            color="tab:gray",
            label="infeasible / failed",
        )
        ax.step(xs, ys, where="post", color="tab:orange", lw=2, label="best so far")
        ax.set_ylim(bottom=0)
        _label(
            ax, "Optimization history", "trial number", "throughput (tokens/s)", loc="lower right"
        )
    return fig


def floor_figure(ranked: list[Record], top: int = 5) -> Figure | None:
    """Floor efficiency (measured time against the roofline floor) per trace, top assemblies."""
    leaders = [r for r in ranked[:top] if _floor(r)]
    if not leaders:
        return None
    traces = sorted({t for r in leaders for t in _floor(r)})
    width = 0.8 / len(leaders)
    with drawing(max(10, 2.2 * len(traces)), 6) as (fig, ax):
        for i, r in enumerate(leaders):
            eff = _floor(r)
            xs = [k + (i - (len(leaders) - 1) / 2) * width for k in range(len(traces))]
            ax.bar(xs, [eff.get(t, 0.0) for t in traces], width, label=f"#{r.number} {r.name}")
        ax.set_xticks(range(len(traces)))
        ax.set_xticklabels(traces)
        _label(
            ax,
            f"Floor efficiency per trace, top {len(leaders)} assemblies",
            "trace",
            "floor efficiency (floor time / measured time)",
            grid="y",
            loc="upper center",
            bbox_to_anchor=(0.5, -0.14),
            ncol=1,
            fontsize=10,
        )
    return fig


def _floor(r: Record) -> dict[str, float]:
    """Floor efficiency per trace: the full protocol's when measured, else the screening's."""
    for prefix in ("full_", "") if r.has_full else ("",):
        per = r.trace_numbers(prefix)
        out = {t: v["floor_eff"] for t, v in per.items() if v.get("floor_eff") is not None}
        if out:
            return out
    return {}


def _applies(r: Record, axis: str) -> bool:
    """The trial chose on this axis (a slab trial has no block size, an eager one no mode)."""
    known = AXES_BY_NAME.get(axis)
    return bool(r.variant) and axis in r.variant and (known is None or known.applies(r.variant))


def varying_axes(records: list[Record]) -> list[str]:
    """Variant axes, in registry order, taking more than one value among the records."""
    out = []
    for axis in AXES_BY_NAME:
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
    with drawing(5.2 * cols, 4.3 * rows, nrows=rows, ncols=cols, squeeze=False) as (fig, grid):
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
    return fig


def importance_figure(importances: dict[str, float]) -> Figure | None:
    """Horizontal bars: the share of the tokens/s variance each parameter explains."""
    if not importances:
        return None
    items = sorted(importances.items(), key=lambda kv: kv[1])
    with drawing(10, max(4, 0.6 * len(items) + 1.8)) as (fig, ax):
        ax.barh([k for k, _ in items], [v for _, v in items], color="tab:green")
        for i, (_, v) in enumerate(items):
            ax.text(v, i, f" {v:.2f}", va="center", fontsize=11)
        ax.set_xlim(0, max(v for _, v in items) * 1.2 or 1)
        x = "importance for tokens/s (fANOVA share, sums to 1)"
        _label(ax, "Parameter importances", x, "parameter", grid="x")
    return fig
