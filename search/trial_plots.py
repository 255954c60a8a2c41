"""Figures of the trials' outcomes: throughput against peak memory with the Pareto front and the
chosen engine, the optimization history, and floor efficiency per trace of the leaders. Each
returns a bare Figure (search.plots) or None when the records hold nothing to draw.
"""

from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure

from search.plots import STYLE, bare_figure, feasible
from search.records import Record

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
    done = sorted((r for r in records if r.status not in ("running", "waiting")), key=_number)
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
        fig, ax = bare_figure(max(10, 2.2 * len(traces)), 6)
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
