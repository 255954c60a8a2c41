"""What every figure of the report shares: the style, a bare matplotlib Figure (drawn by Agg when
saved, no display or pyplot backend involved), the feasible trials, saving as PNG. The figures:
search.trial_plots, search.parameter_plots and search.sweep_plots; `report` and tradeoffs.ipynb
share them.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from search.records import Record

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
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()
