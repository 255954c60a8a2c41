"""`python -m search sweep`: variants by name, JSON or from a study; the JSON file it writes; and
`python -m search report` drawing it."""

import json
from pathlib import Path

import optuna
import pytest

from search.cli import main
from search.report import default_report_dir
from search.study import load_records
from search.sweep_command import leaders, study_variants, variant_from_spec
from search.trial import Record
from search.write import rank
from sweep.plots import DECODE_PNG, PREFILL_PNG
from variants.presets import PRESETS
from variants.probe import UserError
from variants.variant import Variant

optuna.logging.set_verbosity(optuna.logging.WARNING)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SMALL = ["--device", "cpu", "--batches", "1,2", "--lengths", "8,16", "--repeats", "1"]
CEILINGS = ["--ceilings", '{"bandwidth_gbs": 10.0, "tflops": 0.1}']
TINY_CONFIG = str(Path(__file__).resolve().parents[1] / "data" / "tiny_config.json")


def test_a_variant_is_a_preset_a_json_object_or_a_named_json_object():
    assert variant_from_spec("slab-sdpa") == ("slab-sdpa", PRESETS["slab-sdpa"])
    paged = Variant(cache="paged", block_size=64)
    assert variant_from_spec('{"cache": "paged", "block_size": 64}') == (paged.name, paged)
    assert variant_from_spec('#3 best={"cache": "paged", "block_size": 64}') == ("#3 best", paged)
    with pytest.raises(UserError, match="neither a preset"):
        variant_from_spec("no-such-preset")
    with pytest.raises(UserError, match="unknown variant field"):
        variant_from_spec('{"cahce": "paged"}')


@pytest.fixture(scope="module")
def demo(tmp_path_factory, demo_study):
    url = f"sqlite:///{tmp_path_factory.mktemp('sweep_study') / 'demo.db'}"
    return url, demo_study(url, "demo")


def test_study_variants_are_the_chosen_engine_then_the_best_distinct_correct_trials(demo):
    _, study = demo
    best = study.user_attrs["verified_best"]
    picked = study_variants(study, 3)
    assert len(picked) == 3
    assert picked[0][0] == f"#{best['trial']} (chosen) {best['variant_name']}"
    assert picked[0][1].to_dict() == best["variant"]
    ranked = [r for r in rank(load_records(study)) if r.variant != best["variant"]]
    assert [v.to_dict() for _, v in picked[1:]] == [r.variant for r in ranked[:2]]
    assert len({json.dumps(v.to_dict(), sort_keys=True) for _, v in picked}) == 3


def test_compile_variants_can_be_left_out():
    def ok(number, variant, tps):
        attrs = {"variant_name": variant.name, "tokens_per_s": tps, "constraint": [-0.5]}
        return Record(number, "ok", variant.to_dict(), attrs, (tps, 1.0))

    fast, slab, paged = Variant(execution="compile"), Variant(), Variant(cache="paged")
    records = [ok(0, slab, 100.0), ok(1, fast, 300.0), ok(2, paged, 200.0), ok(3, slab, 90.0)]
    best = {"trial": 2, "variant": paged.to_dict()}
    assert leaders(best, records, 3) == [
        (f"#2 (chosen) {paged.name}", paged),
        (f"#1 {fast.name}", fast),
        (f"#0 {slab.name}", slab),
    ]
    assert [v for _, v in leaders({}, records, 3, compile=False)] == [paged, slab]


def test_the_cli_writes_the_json_and_prints_a_table(tmp_path, tiny_weights, capsys):
    out = tmp_path / "s.json"
    args = ["sweep", "--model-config", TINY_CONFIG, "--weight-dir", tiny_weights]
    args += ["--variant", "slab-sdpa", "--variant", 'paged={"cache": "paged"}', "--out", str(out)]
    assert main(args + SMALL + CEILINGS) == 0
    printed = capsys.readouterr().out
    assert "slab-sdpa" in printed and "ms/step" in printed and "ms/call" in printed
    assert f"wrote {out}: 2 of 2 variant(s) measured" in printed
    data = json.loads(out.read_text())
    assert [v["name"] for v in data["variants"]] == ["slab-sdpa", "paged"]
    assert [p["batch"] for p in data["variants"][1]["decode"]] == [1, 2]
    assert [p["length"] for p in data["variants"][1]["prefill"]] == [8, 16]
    assert data["settings"]["decode_repeats"] == data["settings"]["prefill_repeats"] == 1


def test_a_study_sweep_lands_where_report_draws_it(demo, tiny_weights, capsys):
    url, study = demo
    args = ["sweep", "--storage", url, "--top", "2", "--model-config", TINY_CONFIG]
    assert main(args + ["--weight-dir", tiny_weights, "--no-floor"] + SMALL) == 0
    report_dir = default_report_dir(url, "demo")
    data = json.loads((report_dir / "sweep.json").read_text())
    assert len(data["variants"]) == 2 and data["floor"] is None
    assert data["variants"][0]["name"].startswith(f"#{study.user_attrs['verified_best']['trial']}")
    capsys.readouterr()

    assert main(["report", "--storage", url]) == 0
    printed = capsys.readouterr().out
    assert DECODE_PNG in printed and PREFILL_PNG in printed
    for name in (DECODE_PNG, PREFILL_PNG):
        png = report_dir / name
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000
    md = (report_dir / "summary.md").read_text()
    assert f"[`{DECODE_PNG}`]({DECODE_PNG}): decode step time vs batch size at context" in md
    assert f"[`{PREFILL_PNG}`]({PREFILL_PNG}): prefill tokens/s vs prompt length" in md
    assert "measured by `python -m search sweep`" in md
