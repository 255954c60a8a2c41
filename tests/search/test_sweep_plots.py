"""The shape-sweep figures: labelled axes with units, log2 shape axes, a line per engine and the
floor, real PNG files; and the study report drawing a sweep it is given."""

import json

import matplotlib.image as mpimg
import optuna

from search import study as st
from search.figures import write_report
from sweep.plots import (
    DECODE_FLOOR,
    DECODE_LABELS,
    DECODE_PNG,
    PREFILL_FLOOR,
    PREFILL_LABELS,
    PREFILL_PNG,
    decode_figure,
    prefill_figure,
    write_sweep_figures,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BATCHES = (1, 2, 4, 8, 16, 32, 64)
LENGTHS = (16, 64, 128, 256, 512, 1024, 2048, 4096)


def variant(name: str, speed: float) -> dict:
    decode = [
        {
            "batch": b,
            "context": 256,
            "step_ms": (2.0 + 0.05 * b) / speed,
            "floor_ms": 0.1 + 0.01 * b,
        }
        for b in BATCHES
    ]
    prefill = [
        {"length": n, "seconds": (1e-3 + n / 5e5) / speed, "floor_tokens_per_s": 2e6}
        for n in LENGTHS
    ]
    for p in prefill:
        p["tokens_per_s"] = p["length"] / p["seconds"]
    return {"name": name, "variant": {}, "decode": decode, "prefill": prefill, "skipped": []}


SWEEP = {
    "device": "cuda",
    "torch": "2.13.0",
    "gpu": "NVIDIA H200",
    "date": "2026-01-01 00:00:00",
    "settings": {"context": 256},
    "floor": {"ceilings": {"bandwidth_gbs": 4000.0, "tflops": 700.0}},
    "variants": [
        variant("#4 (chosen) slab/triton/eager", 1.0),
        variant("#7 paged64/sdpa-auto/eager", 0.7),
        {"name": "broken", "variant": {}, "decode": [], "prefill": [], "error": "boom"},
    ],
}


def legend(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_decode_figure_has_units_a_log2_batch_axis_and_a_line_per_engine():
    fig = decode_figure(SWEEP)
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == DECODE_LABELS
    assert "batch" in ax.get_xlabel() and "(ms" in ax.get_ylabel()
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(b) for b in BATCHES]
    assert "context 256 tokens" in ax.get_title() and "NVIDIA H200" in ax.get_title()
    assert legend(fig) == [v["name"] for v in SWEEP["variants"][:2]] + [DECODE_FLOOR]


def test_prefill_figure_has_units_a_log2_length_axis_and_a_line_per_engine():
    fig = prefill_figure(SWEEP)
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == PREFILL_LABELS
    assert "tokens" in ax.get_xlabel() and "tokens/s" in ax.get_ylabel()
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(n) for n in LENGTHS]
    assert "NVIDIA H200" in ax.get_title()
    assert legend(fig) == [v["name"] for v in SWEEP["variants"][:2]] + [PREFILL_FLOOR]


def test_nothing_measured_draws_nothing_and_no_floor_draws_no_floor_line():
    empty = dict(SWEEP, variants=[SWEEP["variants"][2]])
    assert decode_figure(empty) is None and prefill_figure(empty) is None
    bare = [
        dict(v, decode=[dict(p, floor_ms=None) for p in v["decode"]]) for v in SWEEP["variants"][:1]
    ]
    fig = decode_figure(dict(SWEEP, variants=bare, floor=None))
    assert legend(fig) == [SWEEP["variants"][0]["name"]]


def test_the_figures_are_real_pngs(tmp_path):
    drawn = write_sweep_figures(SWEEP, tmp_path)
    assert [p.name for p, _ in drawn] == [DECODE_PNG, PREFILL_PNG]
    for path, caption in drawn:
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000
        height, width = mpimg.imread(path).shape[:2]
        assert width >= 900 and height >= 600, (path.name, width, height)
        assert "per engine" in caption


def test_the_report_draws_a_sweep_it_is_given_and_says_so(tmp_path):
    study = st.open_study(st.open_storage(f"sqlite:///{tmp_path}/e.db"), "e")
    sweep = tmp_path / "elsewhere" / "my_sweep.json"
    sweep.parent.mkdir()
    sweep.write_text(json.dumps(SWEEP))
    paths = write_report(study, tmp_path / "out", sweep_path=sweep)
    assert [p.name for p in paths] == [DECODE_PNG, PREFILL_PNG, "summary.md"]
    md = paths[-1].read_text()
    assert f"[`{DECODE_PNG}`]({DECODE_PNG}): decode step time vs batch size at context 256" in md
    assert "on NVIDIA H200, torch 2.13.0" in md and "(`my_sweep.json`)" in md

    # Without --sweep, only a sweep.json next to the report is drawn; an unreadable one is said.
    assert [p.name for p in write_report(study, tmp_path / "none")] == ["summary.md"]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "sweep.json").write_text("{not json")
    paths = write_report(study, tmp_path / "bad")
    assert "could not be read" in paths[-1].read_text()
