"""Choosing: ranking rules, and the engine on disk is always a verified one."""

from pathlib import Path

import pytest

from search.trial import Record
from search.write import Verification, installed, rank, write_verified
from variants.variant import Variant


def rec(number, tps, peak=100.0, status="ok", constraint=-0.5, full=None, variant=None, **attrs):
    variant = variant or Variant(block_size=16 * (number + 1), cache="paged")
    a = {
        "tokens_per_s": tps,
        "peak_mib": peak,
        "constraint": [constraint],
        "variant_name": f"v{number}",
    }
    if full is not None:
        a.update(full_tokens_per_s=full, full_peak_mib=peak, full_status="ok")
    a.update(attrs)
    values = (tps, peak) if status in ("ok", "duplicate", "infeasible") else None
    return Record(number, status, variant.to_dict(), a, values)


def test_rank_orders_by_throughput_and_drops_the_infeasible():
    records = [
        rec(0, 100.0),
        rec(1, 300.0, status="infeasible", constraint=0.2),
        rec(2, 200.0),
        rec(3, 500.0, status="failed"),
        rec(4, 250.0, constraint=0.1),  # correct but uses 60 % of the tolerance
    ]
    assert [r.number for r in rank(records)] == [2, 0]


def test_a_tie_within_one_percent_goes_to_the_smaller_peak():
    records = [rec(0, 1000.0, peak=900.0), rec(1, 995.0, peak=500.0), rec(2, 900.0, peak=10.0)]
    assert [r.number for r in rank(records)] == [1, 0, 2]


def test_peaks_within_five_percent_are_a_tie_too_and_the_faster_goes_first():
    # a 1.2 % smaller peak must not outrank a faster trial
    records = [rec(0, 1000.0, peak=10358.0), rec(1, 996.0, peak=10349.0)]
    records.append(rec(2, 992.0, peak=10234.0))
    assert [r.number for r in rank(records)] == [0, 1, 2]
    records.append(rec(3, 991.0, peak=9000.0))  # 13 % smaller, within 1 %: the peak decides
    assert [r.number for r in rank(records)][0] == 3


def test_full_protocol_numbers_come_first_and_decide_among_themselves():
    records = [
        rec(0, 1000.0, full=700.0),
        rec(1, 900.0, full=800.0),
        rec(2, 950.0),  # never re-measured: after the re-measured ones
        rec(3, 990.0, full_status="failed"),  # crashed under the grader's protocol
    ]
    ranked = rank(records)
    assert [r.number for r in ranked] == [1, 0, 2]
    assert ranked[0].tokens_per_s == 800.0


def test_one_row_per_variant():
    same = Variant(cache="slab")
    records = [rec(0, 100.0, variant=same), rec(1, 120.0, variant=same, status="duplicate")]
    assert [r.number for r in rank(records)] == [0]


def fake_render(variant, path, header=""):
    Path(path).write_text(f"# {variant.name}\n{header}\n")
    return Path(path)


def test_a_candidate_failing_verification_gives_way_to_the_next(tmp_path):
    (tmp_path / "engine.py").write_text("old, verified earlier\n")
    candidates = [rec(0, 300.0), rec(1, 200.0), rec(2, 100.0)]
    seen = []

    def verify(path):
        text = path.read_text()
        seen.append(text.splitlines()[0])
        return Verification("paged32" in text, "output", 0.1, ["test_correctness.py: exit 0"])

    attempts = write_verified(
        candidates, fake_render, tmp_path, verify, lambda r: f"trial {r.number}"
    )
    assert [a.record.number for a in attempts] == [0, 1]
    assert installed(attempts).record.number == 1
    assert (tmp_path / "engine.py").read_text().startswith("# paged32")
    assert not (tmp_path / "verify.tmp").exists()


def test_nothing_verified_leaves_the_old_engine(tmp_path):
    (tmp_path / "engine.py").write_text("old\n")

    def broken_render(variant, path, header=""):
        raise RuntimeError("no such component")

    attempts = write_verified([rec(0, 1.0)], broken_render, tmp_path, None, lambda r: "")
    assert installed(attempts) is None and "render failed" in attempts[0].error
    attempts = write_verified(
        [rec(0, 1.0)], fake_render, tmp_path, lambda p: Verification(False, "x", 0.0), lambda r: ""
    )
    assert installed(attempts) is None
    assert (tmp_path / "engine.py").read_text() == "old\n"


@pytest.mark.parametrize(
    "traces, expected",
    [({"a": 100.0, "b": 400.0}, 200.0), ({"a": 8.0, "b": 8.0, "c": 1.0}, 4.0)],
)
def test_the_objective_is_the_geometric_mean(traces, expected):
    from search.trial import trace_attrs

    rows = {
        name: {
            "tokens_per_s": v,
            "decode_tokens_per_s": v / 2,
            "seconds": 1.0,
            "peak_mib": v,
            "create_s": 0.5,
        }
        for name, v in traces.items()
    }
    attrs = trace_attrs(rows)
    assert attrs["tokens_per_s"] == pytest.approx(expected)
    assert attrs["peak_mib"] == max(traces.values())
    assert attrs["tps_a"] == traces["a"] and attrs["decode_tps_a"] == traces["a"] / 2
