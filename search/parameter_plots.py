"""Figures of what each choice did: throughput by choice on every variant axis that varies, and
the parameter importances. Each returns a bare Figure (search.plots) or None when there is nothing
to draw.
"""

from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure

from search.plots import STYLE, bare_figure, feasible
from search.records import Record
from variants.registry import AXES_BY_NAME

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
