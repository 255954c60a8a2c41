"""Figures of a study, drawn from its records: the throughput/memory trade-off with its Pareto
front, per-axis effects, the optimization history, floor efficiency per trace and parameter
importances. Each function returns a bare matplotlib Figure (drawn by Agg when saved, no display
or pyplot backend involved) or None when the records hold nothing to draw; `report` and
tradeoffs.ipynb share them.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

from search.records import Record
from variants.registry import AXES_BY_NAME

# Axes of the Variant drawn in the per-axis figure, in registry order.
VARIANT_AXES = tuple(AXES_BY_NAME)  # every axis of the registry, in its order
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


def _figure(width: float, height: float, **kwargs):
    """A bare Figure, not registered with pyplot: no backend is switched and nothing leaks when
    many are drawn; callers hold STYLE (rc_context) while they draw."""
    fig = Figure(figsize=(width, height))
    return fig, fig.subplots(**kwargs)


def feasible(records: list[Record]) -> list[Record]:
    return [r for r in records if r.feasible and r.tokens_per_s > 0]


def pareto_front(records: list[Record]) -> list[Record]:
    """Records no other beats on both objectives (more tokens/s, less peak MiB), by memory."""
    front = []
    for r in sorted(records, key=lambda r: (r.peak_mib, -r.tokens_per_s)):
        if not front or r.tokens_per_s > front[-1].tokens_per_s:
            front.append(r)
    return front


def tradeoff_figure(records: list[Record], chosen: int | None = None) -> Figure | None:
    """Throughput against peak memory of every feasible trial, the front, the chosen engine."""
    points = feasible(records)
    if not points:
        return None
    with matplotlib.rc_context(STYLE):
        fig, ax = _figure(10, 6.5)
        ax.scatter(
            [r.peak_mib for r in points],
            [r.tokens_per_s for r in points],
            s=45,
            alpha=0.6,
            color="tab:blue",
            label=f"feasible trials ({len(points)})",
        )
        front = pareto_front(points)
        ax.plot(
            [r.peak_mib for r in front],
            [r.tokens_per_s for r in front],
            "-o",
            color="tab:orange",
            lw=2,
            ms=7,
            drawstyle="steps-post",
            label="Pareto front",
        )
        pick = next((r for r in points if r.number == chosen), None)
        if pick is not None:
            xs = [r.peak_mib for r in points]
            right = pick.peak_mib > (min(xs) + max(xs)) / 2  # label to the left, inside the axes
            ax.scatter(
                [pick.peak_mib],
                [pick.tokens_per_s],
                s=260,
                marker="*",
                color=CHOSEN_COLOR,
                zorder=5,
                label="chosen engine",
            )
            ax.annotate(
                f"#{pick.number} {pick.name}\n{pick.tokens_per_s:,.1f} tok/s, "
                f"{pick.peak_mib:,.0f} MiB",
                (pick.peak_mib, pick.tokens_per_s),
                xytext=(-12 if right else 12, -28),
                textcoords="offset points",
                ha="right" if right else "left",
                fontsize=10,
                color=CHOSEN_COLOR,
                bbox={"boxstyle": "round", "fc": "white", "ec": CHOSEN_COLOR, "alpha": 0.9},
            )
        ax.set_xlabel("peak memory (MiB)")
        ax.set_ylabel("throughput (tokens/s, geometric mean over traces)")
        ax.set_ylim(bottom=0)
        ax.set_title("Throughput vs peak memory of the feasible trials")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")  # y starts at 0: the space under the trials is empty
        fig.tight_layout()
    return fig


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
        fig, grid = _figure(5.2 * cols, 4.3 * rows, nrows=rows, ncols=cols, squeeze=False)
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


def history_figure(records: list[Record]) -> Figure | None:
    """Tokens/s per trial number (infeasible and failed at zero) and the best so far."""
    done = sorted((r for r in records if r.status not in ("running", "waiting")), key=_number)
    if not done:
        return None
    with matplotlib.rc_context(STYLE):
        fig, ax = _figure(10, 5.5)
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


def _number(r: Record) -> int:
    return r.number


def floor_figure(ranked: list[Record], top: int = 5) -> Figure | None:
    """Floor efficiency (measured time against the roofline floor) per trace, top assemblies."""
    leaders = [r for r in ranked[:top] if _floor(r)]
    if not leaders:
        return None
    traces = sorted({t for r in leaders for t in _floor(r)})
    width = 0.8 / len(leaders)
    with matplotlib.rc_context(STYLE):
        fig, ax = _figure(max(10, 2.2 * len(traces)), 6)
        for i, r in enumerate(leaders):
            eff = _floor(r)
            xs = [k + (i - (len(leaders) - 1) / 2) * width for k in range(len(traces))]
            ax.bar(
                xs,
                [eff.get(t, 0.0) for t in traces],
                width,
                label=f"#{r.number} {r.name}",
            )
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


def importance_figure(importances: dict[str, float]) -> Figure | None:
    """Horizontal bars: the share of the tokens/s variance each parameter explains."""
    if not importances:
        return None
    items = sorted(importances.items(), key=lambda kv: kv[1])
    with matplotlib.rc_context(STYLE):
        fig, ax = _figure(10, max(4, 0.6 * len(items) + 1.8))
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


def save(fig: Figure, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (for IPython.display.Image in notebooks)."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()
