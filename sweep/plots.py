"""Figures of a shape sweep (`python -m search sweep`, sweep.measure): decode step time
against batch size and prefill tokens/s against prompt length, one line per engine, the floor of
evaluator/floor.py's cost model as a dashed line. Bare matplotlib Figures, like search.figures'.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

# the look of every figure of ours (search.figures' too)
STYLE = {"font.size": 12, "axes.titlesize": 14, "legend.fontsize": 11, "figure.dpi": 100}
DECODE_PNG = "decode_vs_batch.png"
PREFILL_PNG = "prefill_vs_length.png"
DECODE_LABELS = ("decode batch size (requests per step)", "decode step time (ms, median)")
PREFILL_LABELS = ("prompt length (tokens, one prompt per call)", "prefill throughput (tokens/s)")
DECODE_FLOOR = "floor (cost model: max(FLOPs / peak, bytes / bandwidth))"
PREFILL_FLOOR = "bound: tokens / floor time (cost model)"
LOG_Y_RATIO = 20  # a log y axis once the drawn values span more than this factor


def load_sweep(path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def where(sweep: dict) -> str:
    """The machine of the sweep, for titles: the GPU name, else cpu, with torch and the date."""
    return f"{sweep.get('gpu') or 'cpu'}, torch {sweep.get('torch', '?')}, {sweep.get('date', '')}"


def _lines(sweep: dict, kind: str, x: str, y: str) -> dict[str, list[tuple[float, float]]]:
    return {
        v["name"]: [(p[x], p[y]) for p in v.get(kind, [])]
        for v in sweep.get("variants", [])
        if v.get(kind)
    }


def _floor(sweep: dict, kind: str, x: str, y: str) -> list[tuple[float, float]]:
    """The floor at every measured shape (it depends on the shape only, not on the engine)."""
    points = {p[x]: p[y] for v in sweep.get("variants", []) for p in v.get(kind, []) if p.get(y)}
    return sorted(points.items())


def _draw(ax, lines, floor, labels, title, values_of_x, floor_label) -> None:
    for name, points in lines.items():
        ax.plot(*zip(*points), "-o", lw=2, ms=6, label=name)
    if floor:
        ax.plot(*zip(*floor), "--", color="black", lw=1.5, label=floor_label)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(values_of_x))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(int(v)) for v in values_of_x])
    ys = [y for pts in [*lines.values(), floor] for _, y in pts if y > 0]
    if ys and max(ys) / min(ys) > LOG_Y_RATIO:
        ax.set_yscale("log")
        if max(ys) / min(ys) < 1e3:  # a few decades: label 1, 2, 5 of each
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(_plain))
    else:
        ax.set_ylim(bottom=0, top=1.1 * max(ys or [1]))
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    rows = len(lines) + bool(floor)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1, fontsize=10)
    ax.figure.set_size_inches(10, 6.2 + 0.3 * rows)


def _plain(value: float, _pos=None) -> str:
    """Log-axis tick labels as plain numbers (0.5, 10, 20,000), not powers of ten."""
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


# kind: (its x and y keys, the floor's y key, the axis labels, the floor's label)
KINDS = {
    "decode": ("batch", "step_ms", "floor_ms", DECODE_LABELS, DECODE_FLOOR),
    "prefill": ("length", "tokens_per_s", "floor_tokens_per_s", PREFILL_LABELS, PREFILL_FLOOR),
}


def _figure(sweep: dict, kind: str, title: str) -> Figure | None:
    x, y, floor_y, labels, floor_label = KINDS[kind]
    lines = _lines(sweep, kind, x, y)
    if not lines:
        return None
    shapes = sorted({v for pts in lines.values() for v, _ in pts})
    floor = _floor(sweep, kind, x, floor_y)
    with matplotlib.rc_context(STYLE):
        fig = Figure()
        _draw(fig.subplots(), lines, floor, labels, f"{title}\n{where(sweep)}", shapes, floor_label)
        fig.tight_layout()
    return fig


def decode_figure(sweep: dict) -> Figure | None:
    """Median decode step time against batch size, one line per engine, and the floor."""
    context = sweep.get("settings", {}).get("context", "?")
    return _figure(sweep, "decode", f"Decode step time vs batch size, context {context} tokens")


def prefill_figure(sweep: dict) -> Figure | None:
    """Prefill tokens/s of one prompt against its length, one line per engine, and the floor."""
    return _figure(sweep, "prefill", "Prefill throughput vs prompt length (batch 1)")


def save(fig: Figure, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def write_sweep_figures(sweep: dict, out_dir) -> list[tuple[Path, str]]:
    """Write both PNGs into `out_dir`; (path, caption) of each one drawn."""
    context = sweep.get("settings", {}).get("context", "?")
    floor = " and the cost-model floor" if sweep.get("floor") else ""
    bound = " and the cost-model bound" if sweep.get("floor") else ""
    drawn = []
    for name, fig, caption in (
        (
            DECODE_PNG,
            decode_figure(sweep),
            f"decode step time vs batch size at context {context}, per engine{floor}",
        ),
        (
            PREFILL_PNG,
            prefill_figure(sweep),
            f"prefill tokens/s vs prompt length (one prompt), per engine{bound}",
        ),
    ):
        if fig is not None:
            drawn.append((save(fig, Path(out_dir) / name), caption))
    return drawn
