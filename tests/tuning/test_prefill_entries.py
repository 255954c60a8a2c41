"""The prefill entries' search (tuning/prefill_entries.py, the prefill part of few_row.tune):
the rules are no entry, the check's references (float32 for the GEMMs, the kernel's own output
without the prefetch for the short kernels) and the faults it must catch, and the search's loop
with fake timers keeping only the entries that win (the real bench times a GPU)."""

import contextlib
from dataclasses import replace

import pytest
import torch

from tuning import few_row as tuner
from tuning import prefill_entries as entries
from tuning.prefill_attention import PrefillBucket
from variants.build import build_engine
from variants.spec import ModelSpec
from variants.variant import Variant

pytest.importorskip("triton", reason="triton is not installed")

FUSED = Variant(cache="slab", attention="triton", layers="fused")  # runs on the CPU
GRAPHS = replace(FUSED, graphs="pow2", prefill_graphs="pow2")  # the search's target on a GPU


def test_the_rules_are_no_entry_and_a_cpu_offers_no_other_library():
    assert entries.entry_of(entries.PRIOR) == {}
    both = {"library": "cublaslt", "ahead": 0.5}
    assert entries.entry_of(both) == both
    assert entries.libraries("cpu") == ("default",)
    values = entries.candidates(("default", "cublaslt"), "ahead", both, None, None, 0)
    assert values[0] == 0.5 and sorted(values) == sorted(entries.AHEAD)
    assert entries.candidates(("default",), "library", entries.PRIOR, None, None, 0) == ["default"]


@pytest.fixture
def check(tiny_config):
    return entries.EntryCheck(ModelSpec.from_config(tiny_config), 16, "cpu", torch.float16)


def test_the_check_passes_the_rules_and_every_share(check):
    prior = check.error(entries.PRIOR)
    assert prior < 1e-2
    for share in entries.AHEAD:
        assert check.error({"library": "default", "ahead": share}) == prior


@pytest.mark.parametrize("kernel", ["add_rms_norm", "rope_and_cache_write", "silu_mul"])
def test_a_short_kernel_wrong_only_while_it_prefetches_is_caught(check, monkeypatch, kernel):
    real = getattr(entries, kernel)

    def planted(*args, **kwargs):
        out = real(*args, **kwargs)
        if kwargs.get("ahead") is None:
            return out
        first = out[0] if isinstance(out, tuple) else out
        first.add_(1.0)  # the rotated q, the residual sum, the activation
        return out

    monkeypatch.setattr(entries, kernel, planted)
    assert check.error(entries.PRIOR) < 1e-2
    assert check.error({"library": "default", "ahead": 0.25}) >= 0.5


def test_a_library_that_computes_wrong_is_caught(check, monkeypatch):
    @contextlib.contextmanager
    def wrong_library(name, device):
        if name is None:
            yield
            return
        real = torch.nn.functional.linear
        monkeypatch.setattr(entries.F, "linear", lambda x, w: 1.01 * real(x, w))
        try:
            yield
        finally:
            monkeypatch.setattr(entries.F, "linear", real)

    monkeypatch.setattr(entries, "blas_library", wrong_library)
    assert check.error(entries.PRIOR) < 1e-2
    assert check.error({"library": "cublaslt", "ahead": 0.0}) > 2e-2


class AnyEntry:
    """A check every entry passes (the real one runs the kernels)."""

    def __init__(self, *args):
        pass

    def error(self, knobs):
        return 0.0

    def build(self, knobs):
        pass


def ahead_faster_at(tokens: int, share: float = 0.5):
    """A fake PrefillBench: the call twice as fast with `share` asked ahead at `tokens`, the rest
    a tie; each timed entry goes into the table as the real bench's does."""

    class Bench:
        ids: list = []

        def __init__(self, engine, bucket, check, vocab, table, key):
            self.bucket, self.check, self.table, self.key = bucket, check, table, key

        def error(self, knobs):
            return self.check.error(knobs)

        def build(self, knobs):
            pass

        def time_ms(self, knobs):
            self.table[self.key] = entries.entry_of(knobs)
            faster = self.bucket.tokens == tokens and knobs["ahead"] == share
            return 0.5 if faster else 1.0

    return Bench


class AnyLaunch:
    def __init__(self, *args):
        pass

    def error(self, launch):
        return 0.0


class TiedStep:
    """A fake StepBench where every launch ties (the decode buckets keep the rules)."""

    ids: list = []

    def __init__(self, engine, bucket, check, vocab, table, key):
        self.table, self.key = table, key

    def error(self, launch):
        return 0.0

    def build(self, launch):
        pass

    def time_ms(self, launch):
        self.table[self.key] = launch
        return 1.0


def test_the_search_keeps_only_the_prefill_entry_that_won(tiny_config, tiny_weights, monkeypatch):
    """tune() with prefill graphs, on the CPU (the engine built without graphs, the benches
    fake): the prefill buckets are searched first, and only the bucket where asking half the
    next weight ahead was faster holds an entry; every decode bucket keeps the rules."""
    monkeypatch.setattr(tuner, "device_sm_count", lambda device: 132)
    real = tuner.build_engine
    bare = dict(graphs="off", prefill_graphs="off")
    monkeypatch.setattr(
        tuner, "build_engine", lambda c, w, d, v, **kw: real(c, w, d, replace(v, **bare), **kw)
    )
    buckets = tuner.prefill_buckets(tiny_config, tuner.prefill_graph_buckets())
    heaviest = buckets[0].tokens
    table, results = tuner.tune(
        tiny_config, tiny_weights, GRAPHS, 60.0, "cpu", log=lambda line: None,
        bench=TiedStep, check=AnyLaunch, prefill_bench=ahead_faster_at(heaviest),
        prefill_check=AnyEntry,
    )  # fmt: skip
    kinds = [kernel for kernel, _ in results]
    assert kinds[: len(buckets)] == ["prefill"] * len(buckets) and len(set(kinds)) > 1
    assert table == {("prefill", heaviest): {"ahead": 0.5}}
    rows = tuner.summary(results)
    assert {r["tokens"] for r in rows if r["kernel"] == "prefill"} == {b.tokens for b in buckets}
    assert all("rows" in r for r in rows if r["kernel"] != "prefill")
    # without prefill graphs there is no prefill bucket to search
    table, results = tuner.tune(
        tiny_config, tiny_weights, FUSED, 60.0, "cpu", log=lambda line: None,
        bench=TiedStep, check=AnyLaunch, prefill_bench=ahead_faster_at(heaviest),
        prefill_check=AnyEntry,
    )  # fmt: skip
    assert table == {} and "prefill" not in {kernel for kernel, _ in results}


def test_an_entry_its_check_rejects_never_wins(tiny_config, tiny_weights):
    """tune_prefills with the real check and a kernel wrong while it prefetches: the faster
    entry is rejected and the rules stay (no entry)."""
    engine = build_engine(tiny_config, tiny_weights, "cpu", FUSED)
    spec = ModelSpec.from_config(tiny_config)

    class Wrong(entries.EntryCheck):
        def error(self, knobs):
            return 1.0 if knobs["ahead"] else super().error(knobs)

    bucket = PrefillBucket(16, (10, 6), calls=1, weight=1.0)
    live: dict = {}
    found = tuner.tune_prefills(
        engine, spec, [bucket], [], live, float("inf"), lambda line: None,
        bench=ahead_faster_at(16), check=Wrong,
    )  # fmt: skip
    ((kernel, tuned),) = found
    assert kernel == "prefill" and tuned.best == entries.PRIOR and tuned.rejected
    assert live == {("prefill", 16): {}}


def test_a_prefill_result_has_its_line_in_the_results_log():
    from search.kernel_phase import KernelSearch, TableSearch, lines

    row = {"kernel": "prefill", "tokens": 256, "calls": 13, "weight": 2.03, "prior_us": 1470.0,
           "best_us": 1400.0, "tried": 7, "rejected": 0, "moved": {"ahead": 0.5}}  # fmt: skip
    search = KernelSearch("hand", 60.0, few_row=TableSearch({}, [row]))
    text = lines(search)
    assert "prefill   256 tokens (13 calls, weight 2.03): the call 1470.0 -> 1400.0 us" in text
    assert "ahead=0.5" in text


@pytest.mark.gpu
def test_gpu_the_prefill_bench_captures_the_bucket_s_graph_again(tiny_config, tiny_weights):
    """On a GPU: the prefill graph of the bucket captured again with each entry (the one the
    engine's table holds as it is timed) and timed at its prompts, the engine's state intact."""
    variant = replace(GRAPHS, dtype="float16")
    engine = build_engine(tiny_config, tiny_weights, "cuda", variant, few_row_knobs={})
    spec = ModelSpec.from_config(tiny_config)
    table = tuner.engine_table(engine)
    bucket = PrefillBucket(64, (40, 20), calls=1, weight=1.0)
    check = entries.EntryCheck(spec, 64, "cuda", torch.float16)
    bench = entries.PrefillBench(engine, bucket, check, spec.vocab_size, table, ("prefill", 64))
    for knobs in (entries.PRIOR, {"library": entries.libraries("cuda")[-1], "ahead": 0.5}):
        before = engine.prefill_runner.graphs.get(64)
        ms = bench.time_ms(knobs, replays=3, rounds=1)
        assert ms > 0 and table[("prefill", 64)] == entries.entry_of(knobs)
        assert engine.prefill_runner.graphs[64] is not before  # captured again
        assert check.error(knobs) < 1e-2
    engine.remove(bench.ids)
    assert not engine.lengths
