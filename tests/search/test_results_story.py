"""results.log's account of what the sampler found beyond the queued presets."""

from search.report import beyond_presets
from search.trial import NEAREST, Record


def record(number, variant, source=None, status="ok", **tps):
    attrs = {f"tps_{name}": value for name, value in tps.items()}
    attrs.update(status=status, constraint=[-0.3], variant=variant)
    attrs["tokens_per_s"] = (tps["prefill"] * tps["decode"]) ** 0.5 if tps else 0.0
    if source:
        attrs["source"] = source
    values = (attrs["tokens_per_s"], 100.0) if status == "ok" else None
    return Record(number, status, variant, attrs, values)


PRESET = {"cache": "slab", "attention": "triton", "layers": "fused"}
SAMPLED = {"cache": "paged", "attention": "triton", "layers": "fused-pdl"}


def test_the_samplers_best_against_the_best_queued_trace_by_trace():
    queued = record(0, PRESET, "preset:slab-fused", prefill=400.0, decode=100.0)
    slower = record(1, {**PRESET, "cache": "contiguous"}, prefill=100.0, decode=50.0)
    found = record(2, SAMPLED, prefill=380.0, decode=125.0)
    again = Record(3, "duplicate", SAMPLED, {**found.attrs, "duplicate_of": 2})
    text = beyond_presets(found, [queued, slower, found, again])
    assert text.splitlines()[0].startswith(
        "beyond the presets: the sampler ran 2 trial(s) (and proposed 1 already run, not run "
        "again); its best, trial 2, beat the best "
    )
    # the search's own proposal in the copy's place counts as the sampler's, not as queued
    nearest = record(4, {**SAMPLED, "cache": "slab"}, NEAREST, prefill=390.0, decode=130.0)
    text = beyond_presets(nearest, [queued, slower, found, again, nearest])
    assert text.splitlines() == [
        "beyond the presets: the sampler ran 3 trial(s) (and proposed 1 already run, not run "
        "again; in their place 1 untried one(s) nearest the leader); its best, trial 4, beat "
        "the best queued one (preset:slab-fused, trial 0): 1.126x on the geometric mean "
        "(screening) and is the one written",
        "per trace: prefill 0.975x, decode 1.300x",
        "where they differ: layers=fused-pdl (preset: fused)",
    ]
    assert "did not beat" in beyond_presets(queued, [queued, slower])


def test_a_run_the_presets_filled_says_so():
    queued = record(0, PRESET, "preset:slab-fused", prefill=400.0, decode=100.0)
    waiting = Record(1, "waiting", SAMPLED, {"source": "preset:x"})
    assert "ran no trial" in beyond_presets(queued, [queued, waiting])
    failed = Record(2, "failed", SAMPLED, {"reason": "crash"})
    assert "ran 1 trial(s), none correct" in beyond_presets(queued, [queued, failed])


def test_a_run_that_ran_no_trial_says_so_and_what_to_do():
    """A budget the warm-up and the verification's reserve took whole (a 16-layer model in 4
    minutes, 2026-12-04): the log says that no trial ran and how to get some, not that the
    presets took the budget or that measured trials failed verification."""
    from search.report import _why

    waiting = [Record(n, "waiting", PRESET, {"source": f"preset:{n}"}) for n in range(3)]
    default = Record(-1, "ok", PRESET, {"name": "slab-fused"}, None)
    for text in (beyond_presets(default, waiting), _why(default, [], ran=False)):
        assert "no trial ran" in text and "--budget-minutes" in text
        assert "went to the presets" not in text and "measured trial passed" not in text
    assert "no measured trial passed verification" in _why(default, [], ran=True)
