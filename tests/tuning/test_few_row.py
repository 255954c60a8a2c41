"""The few-row kernels' knob search: the prior is the launchers' own launch, the candidates,
the search's gate (a wrong or refused launch never wins), the table through the engine, its
file and JSON, and the search's loop with fake timers (the real one times a GPU)."""

import functools
import json
import time

import pytest
import torch

from evaluator.engine_loader import load_engine_module
from evaluator.reference_model import ReferenceModel
from tuning import decode_attention
from tuning import few_row as tuner
from variants.build import build_engine
from variants.kernels import few_row_linear, norm_qkv_rope, norm_swiglu
from variants.presets import PRESETS
from variants.render import render_engine, render_source
from variants.spec import ModelSpec
from variants.variant import Variant

KERNELS = (*tuner.LAYER_KERNELS, "head")
LAUNCHERS = {
    few_row_linear: "_few_row_linear_kernel",
    norm_qkv_rope: "_norm_qkv_rope_kernel",
    norm_swiglu: "_norm_swiglu_kernel",
}
FUSED = Variant(cache="slab", attention="triton", layers="fused")  # runs on the CPU
# a launch no rule picks at any rows of the tiny model, valid for every kernel there
ODD = {"tiles": (16, 32, 2, 2), "split_k": 2}


@pytest.fixture
def recorded(monkeypatch, launch_recorder):
    """The few-row kernels' launches (grid and every argument but the tensors), none run."""
    launches, Recorder = launch_recorder
    for module, name in LAUNCHERS.items():
        monkeypatch.setattr(module, name, Recorder())
        monkeypatch.setattr(module, "launch_options", lambda pdl, device: {"launch_pdl": pdl})
    return launches


@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_the_prior_is_the_launch_the_launchers_make(course, recorded, pdl):
    """At the course's shapes, each kernel launched by default and with the prior's knobs:
    the same grid, tiles, splits, staging, warps and stages (recorded, not run)."""
    _, spec = course
    for rows in (1, 3, 8, 16, 32, 64):
        for kernel in tuner.kernels_at(rows, pdl):
            check = tuner.FewRowCheck(kernel, spec, rows, "cpu", torch.float16, pdl, 132)
            recorded.clear()
            check.run({})
            check.run(tuner.launch_of(tuner.prior_launch(kernel, rows, spec, 132, pdl)))
            assert len(recorded) == 2 and recorded[0] == recorded[1], (kernel, rows)


def test_kernels_follow_the_fused_stack_s_row_limits():
    assert tuner.kernels_at(16, False) == (*tuner.LAYER_KERNELS, "head")
    assert tuner.kernels_at(32, False) == ("head",)
    assert tuner.kernels_at(32, True) == (*tuner.LAYER_KERNELS, "head")
    assert tuner.kernels_at(128, True) == ()


@pytest.mark.parametrize("kernel", KERNELS)
def test_candidates_start_at_the_prior_and_are_valid_launches(course, kernel):
    _, spec = course
    n, k, _ = tuner.kernel_shape(kernel, spec)
    for rows in (1, 8, 32):
        prior = tuner.prior_launch(kernel, rows, spec, 132, True)
        for axis in tuner.AXES:
            values = tuner.candidates(kernel, axis, prior, spec, None, 132)
            if axis == "library":  # cuBLAS for the head alone (its fallback, after the norm)
                assert values == (["triton", "cublas"] if kernel == "head" else ["triton"])
                continue
            if axis == "pdl":  # offered where the GPU and Triton have it
                assert values == [True]
                with_pdl = tuner.candidates(kernel, axis, prior, spec, None, 132, has_pdl=True)
                assert with_pdl == [True, False]
                continue
            assert values[0] == prior[axis] and len(values) == len(set(values)) > 1
            if axis in ("block_n", "block_k", "warps"):
                assert all(v & (v - 1) == 0 for v in values)  # powers of two
            if axis in ("block_n", "block_k"):  # tl.dot's least
                assert all(v >= 16 for v in values)
            assert all(v >= 1 for v in values)
            if axis == "split_k":
                assert all(1 <= v <= -(-k // prior["block_k"]) for v in values)


def test_on_cublas_no_knob_of_ours_moves(course):
    """The head on cuBLAS: its launch says so alone, and the descent tries no tile or split
    there (each would time the same cuBLAS call)."""
    _, spec = course
    point = {**tuner.prior_launch("head", 8, spec, 132, True), "library": "cublas"}
    assert tuner.launch_of(point) == {"cublas": True, "pdl": True}
    for axis in tuner.AXES:
        assert tuner.candidates("head", axis, point, spec, None, 132) == [point[axis]]


def test_the_table_round_trips_json():
    table = {("qkv", 8): {"tiles": (16, 256, 4, 3), "split_k": 1, "pdl": False},
             ("down", 1): dict(ODD), ("o", 4): {**ODD, "pdl": True},
             ("head", 4): {"cublas": True, "pdl": True}}  # fmt: skip
    assert tuner.table_from_json(json.loads(json.dumps(tuner.table_to_json(table)))) == table


def search(spec, bench, kernel="down", rows=8, sm_count=132, has_pdl=False):
    bucket = decode_attention.Bucket(rows, 1024, (131,) * rows, 1)
    prior = tuner.prior_launch(kernel, rows, spec, sm_count, False)
    values = functools.partial(tuner.candidates, kernel, has_pdl=has_pdl)
    found = decode_attention.tune_bucket(
        bench, prior, spec, bucket, sm_count, time.monotonic() + 60, tuner.AXES, values
    )
    return prior, found


def test_the_search_keeps_the_faster_launch_and_the_prior_on_ties(course, fake_bench):
    _, spec = course
    prior, found = search(spec, fake_bench({}))  # every launch as fast as the prior
    assert found.best == prior and found.tried > 10
    prior, found = search(spec, fake_bench({("block_n", 64): 0.2, ("warps", 8): 0.005}))
    assert found.best == {**prior, "block_n": 64}  # 0.5% is within the margin
    assert found.moved == {"block_n": 64} and found.best_ms == pytest.approx(0.8)


def test_the_head_moves_to_cublas_where_it_is_faster_and_only_there(course, fake_bench):
    """The library is the head's first knob: cuBLAS kept where it times faster (and no knob of
    ours is timed on it), the prior kept where it is not."""
    _, spec = course
    prior, found = search(spec, fake_bench({("library", "cublas"): 0.3}), kernel="head")
    assert found.moved == {"library": "cublas"}
    assert tuner.launch_of(found.best) == {"cublas": True, "pdl": False}
    prior, found = search(spec, fake_bench({("library", "cublas"): -0.3}), kernel="head")
    assert found.best == prior and tuner.launch_of(found.best)["tiles"]
    bench = fake_bench({("library", "cublas"): 0.3})
    search(spec, bench, kernel="down")
    assert all(t["library"] == "triton" for t in bench.timed)  # the layers' kernels: ours


def test_a_kernel_s_pdl_moves_where_it_is_faster_and_only_where_the_gpu_has_it(
    course, fake_bench
):  # fmt: skip
    """PDL is a kernel's own knob: kept where it times faster, the prior kept where it does not,
    never timed where the GPU or Triton lacks it."""
    _, spec = course
    _, found = search(spec, fake_bench({("pdl", True): 0.3}), kernel="o", has_pdl=True)
    assert found.moved == {"pdl": True} and tuner.launch_of(found.best)["pdl"] is True
    prior, found = search(spec, fake_bench({("pdl", True): -0.3}), kernel="o", has_pdl=True)
    assert found.best == prior
    bench = fake_bench({("pdl", True): 0.3})
    search(spec, bench, kernel="o")
    assert all(t["pdl"] is False for t in bench.timed)


def test_the_split_is_searched_before_the_tiles(course, fake_bench):
    """A short budget reaches the split first: after the prior, the launches timed move the
    split alone until its values are spent (the 1B model's QKV lost most to its split)."""
    _, spec = course
    bench = fake_bench({("split_k", 1): 0.3})
    prior, found = search(spec, bench, kernel="down", rows=8)
    assert prior["split_k"] > 1  # the rules split the course model's down projection at 8 rows
    splits = tuner.candidates("down", "split_k", prior, spec, None, 132)[1:]
    assert bench.timed[0] == prior
    moved = bench.timed[1 : 1 + len(splits)]
    assert [t["split_k"] for t in moved] == splits
    assert all({k: v for k, v in t.items() if k != "split_k"} == {
        k: v for k, v in prior.items() if k != "split_k"} for t in moved)  # fmt: skip
    assert found.best["split_k"] == 1


def test_a_refused_launch_is_rejected_not_fatal(course, fake_bench):
    _, spec = course
    prior, found = search(spec, fake_bench({("stages", 6): 0.5}, refused=[("stages", 6)]))
    assert found.best == prior
    assert any("shared memory" in str(err) for _, err in found.rejected)


def test_a_planted_wrong_launch_is_rejected_by_the_float32_check(
    tiny_config, monkeypatch, fake_bench
):
    """Through Triton's interpreter: the down projection's real kernel checked against the
    reference; its launcher corrupted at split_k=2, which the fake timer makes the fastest by
    far (once 32-wide chunks leave three to split). Without the check it would win."""
    spec = ModelSpec.from_config(tiny_config)
    real = few_row_linear.few_row_linear

    def planted(*args, split_k=None, **kwargs):
        out = real(*args, split_k=split_k, **kwargs)
        return out + 0.5 if split_k == 2 else out  # (a lost split, say)

    monkeypatch.setattr(tuner, "few_row_linear", planted)
    check = tuner.FewRowCheck("down", spec, 3, torch.device("cpu"), torch.float32, False, 4)

    class Timed(fake_bench):
        def error(self, knobs):
            return check.error(tuner.launch_of(knobs))

    bench = Timed({("block_k", 32): 0.1, ("split_k", 2): 0.5})
    prior, found = search(spec, bench, rows=3, sm_count=4)
    assert check.error(tuner.launch_of(prior)) < 1e-4
    assert found.best == {**prior, "block_k": 32}  # the right, faster chunks are kept
    assert any(knobs["split_k"] == 2 for knobs, _ in found.rejected)
    assert all(t["split_k"] != 2 for t in bench.timed)  # rejected before it is timed


def test_the_check_judges_the_head_on_cublas_as_the_engine_runs_it(tiny_config):
    """The head's cuBLAS launch is checked against the float32 reference as the fused head
    runs it (our norm kernel, then the projection), and a planted fault in the norm's weight
    fails it."""
    spec = ModelSpec.from_config(tiny_config)
    check = tuner.FewRowCheck("head", spec, 3, torch.device("cpu"), torch.float32, False, 4)
    assert check.error({"cublas": True}) < 1e-4
    check.norm[0] += 1
    assert check.error({"cublas": True}) > 1e-2


def test_the_fused_head_runs_cublas_where_the_table_says_so(tiny_config, monkeypatch):
    """A `cublas` entry sends that row count to our norm kernel and cuBLAS's projection (the
    reference's numbers), the other row counts to the fused kernel."""
    from variants.layers import fused_stack

    spec = ModelSpec.from_config(tiny_config)
    ran, real = [], fused_stack.few_row_linear
    monkeypatch.setattr(
        fused_stack, "few_row_linear", lambda *a, **k: ran.append("ours") or real(*a, **k)
    )
    fallback = lambda x, norm_w, head_w: ran.append("fallback")  # noqa: E731
    head = fused_stack.fused_head(spec, fallback, knobs={("head", 4): {"cublas": True}})
    gen = torch.Generator().manual_seed(3)
    h, norm = torch.randn(4, spec.hidden_size, generator=gen), torch.rand(spec.hidden_size) + 0.5
    w = torch.randn(spec.vocab_size, spec.hidden_size, generator=gen) * spec.hidden_size**-0.5
    want = tuner.rms_norm(h, norm, spec.rms_norm_eps) @ w.T
    assert (head(h, norm, w).float() - want).abs().max() < 1e-4 and ran == []
    assert (head(h[:2], norm, w) - want[:2]).abs().max() < 1e-4 and ran == ["ours"]


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_check_passes_right_launches_of_every_kernel(tiny_config, kernel):
    spec = ModelSpec.from_config(tiny_config)
    check = tuner.FewRowCheck(kernel, spec, 3, torch.device("cpu"), torch.float32, False, 4)
    assert check.error(tuner.launch_of(tuner.prior_launch(kernel, 3, spec, 4, False))) < 1e-4
    assert check.error(ODD) < 1e-4
    check.norm[0] += 1  # a planted fault where the kernel reads the norm: the reference differs
    if kernel != "o" and kernel != "down":
        assert check.error(ODD) > 1e-2


def _scenario(engine, ref, vocab) -> float:
    """Prefill three prompts, decode 3 rows, then 1: the largest gap to the reference."""
    gen = torch.Generator().manual_seed(5)
    history = {7: 5, 3: 40, 11: 1}
    history = {r: torch.randint(0, vocab, (n,), generator=gen) for r, n in history.items()}
    worst = 0.0

    def gap(ids, out) -> float:
        wants = [ref.forward(history[rid][None])[0, -1] for rid in ids]
        return max((out[i] - want).abs().max().item() for i, want in enumerate(wants))

    worst = gap(list(history), engine.prefill(list(history), list(history.values())))
    for ids in ([3, 11, 7], [11]):
        tokens = torch.randint(0, vocab, (len(ids),), generator=gen)
        for i, rid in enumerate(ids):
            history[rid] = torch.cat([history[rid], tokens[i : i + 1]])
        worst = max(worst, gap(ids, engine.decode(ids, tokens)))
    return worst


def _odd_table():
    return {(kernel, rows): dict(ODD) for kernel in KERNELS for rows in (1, 3)}


def test_an_engine_with_a_table_launches_it_and_matches_the_reference(
    tiny_config, sharp_weights, engine_namespace, patch_engine
):
    engine = build_engine(tiny_config, sharp_weights, "cpu", FUSED, few_row_knobs=_odd_table())
    asked, namespace = [], engine_namespace(engine)
    for name in ("few_row_linear", "norm_qkv_rope", "norm_swiglu"):

        def launch(*args, real=namespace[name], name=name, **kwargs):
            asked.append((name, len(args[0]), kwargs.get("tiles"), kwargs.get("split_k")))
            return real(*args, **kwargs)

        patch_engine(engine, name, launch)
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    assert _scenario(engine, ref, tiny_config["vocab_size"]) < 1e-4
    # the two steps' two layers of four kernels and heads, and the prefill's head (its 3 rows)
    assert len(asked) == 2 * (2 * 4 + 1) + 1
    assert all(a[2:] == (ODD["tiles"], ODD["split_k"]) for a in asked), asked


def test_the_table_is_written_into_the_engine_which_matches_the_library(written_engine):
    table = _odd_table()
    text, module, gaps = written_engine(FUSED, _scenario, few_row_knobs=table)
    assert text.count("FEW_ROW_KNOBS = {") == 1
    assert "    ('down', 3): dict(tiles=(16, 32, 2, 2), split_k=2),\n" in text
    assert "stack=functools.partial(run_fused_stack, knobs=FEW_ROW_KNOBS)" in text
    assert "head=functools.partial(fused_head, knobs=FEW_ROW_KNOBS)" in text
    assert module.FEW_ROW_KNOBS == table
    assert gaps[0] == gaps[1] and gaps[0] < 1e-4  # the same engine, right


def test_an_engine_with_the_head_on_cublas_is_written_and_matches_the_reference(written_engine):
    table = {**_odd_table(), ("head", 1): {"cublas": True}, ("head", 3): {"cublas": True}}
    text, module, gaps = written_engine(FUSED, _scenario, few_row_knobs=table)
    assert "    ('head', 3): dict(cublas=True),\n" in text and module.FEW_ROW_KNOBS == table
    assert gaps[0] == gaps[1] and gaps[0] < 1e-4


def test_without_a_table_the_fastest_engine_is_unchanged(kernel_lines):
    fastest = PRESETS["slab-triton-pdl-allgraphs"]
    text = render_source(fastest)
    assert render_source(fastest, few_row_knobs={}) == text
    assert "FEW_ROW_KNOBS" not in text and "knobs=" not in text.split("def create_engine")[1]
    tuned = render_source(fastest, few_row_knobs=_odd_table())
    # every kernel keeps its line (Triton's cache key holds it): the table goes after them
    assert kernel_lines(tuned) == kernel_lines(text) and len(kernel_lines(text)) > 10
    assert "stack=functools.partial(run_fused_stack, pdl=True, knobs=FEW_ROW_KNOBS)" in tuned


def test_an_engine_without_the_fused_layers_carries_no_table():
    text = render_source(PRESETS["slab-triton-fused-allgraphs"], few_row_knobs=_odd_table())
    assert "FEW_ROW_KNOBS" not in text


def test_row_buckets_weigh_every_context_of_their_rows(course):
    config, spec = course
    buckets = decode_attention.graph_buckets(spec, (9, 0))
    per_context = decode_attention.trace_buckets(config, buckets)
    rows = tuner.row_buckets(config, buckets)
    assert len({b.rows for b in rows}) == len(rows)
    assert [b.weight for b in rows] == sorted((b.weight for b in rows), reverse=True)
    for b in rows:
        same = [c for c in per_context if c.rows == b.rows]
        assert b.weight == pytest.approx(sum(c.weight for c in same))
        assert b.steps == sum(c.steps for c in same)
        assert (b.context, b.lengths) == (same[0].context, same[0].lengths)  # the heaviest


class AnyLaunch:
    """A check every launch passes (the real one needs the kernels run)."""

    def __init__(self, kernel, *args):
        self.kernel = kernel

    def error(self, launch):
        return 0.0


def down_faster_at(block_n: int):
    """A fake StepBench: the down projection twice as fast at `block_n` columns, the rest a
    tie; each timed launch goes into the table as the real bench's does."""

    class Bench:
        ids: list = []  # (no request of its own)

        def __init__(self, engine, bucket, check, vocab, table, key):
            self.check, self.key, self.table = check, key, table

        def error(self, launch):
            return self.check.error(launch)

        def build(self, launch):
            self.check.error(launch)

        def time_ms(self, launch):
            self.table[self.key] = launch
            return 0.5 if self.key[0] == "down" and launch["tiles"][0] == block_n else 1.0

    return Bench


def test_the_search_loop_keeps_only_what_moved(tiny_config, tiny_weights, monkeypatch):
    """tune() on the CPU with a fake bench and check: the down projection is faster at
    BLOCK_N 32 at every rows bucket (the rules': 16), the rest ties; the table holds only
    those entries."""
    monkeypatch.setattr(tuner, "device_sm_count", lambda device: 132)
    table, results = tuner.tune(
        tiny_config, tiny_weights, FUSED, 60.0, "cpu", log=lambda line: None,
        bench=down_faster_at(32), check=AnyLaunch,
    )  # fmt: skip
    assert results and {kernel for kernel, _ in results} == set(KERNELS)
    downs = [found for kernel, found in results if kernel == "down"]
    assert set(table) == {("down", found.bucket.rows) for found in downs}
    assert all(f.prior["block_n"] == 16 for f in downs)
    assert all(table["down", f.bucket.rows]["tiles"][0] == 32 for f in downs)
    assert all(f.best == f.prior for kernel, f in results if kernel != "down")
    summary = tuner.summary(results)
    assert all(r["best_us"] <= r["prior_us"] for r in summary)


@pytest.mark.parametrize("has_pdl", [True, False], ids=["hopper", "elsewhere"])
def test_the_search_asks_each_kernel_s_pdl_where_the_gpu_has_it(
    tiny_config, tiny_weights, monkeypatch, has_pdl
):  # fmt: skip
    """Where the GPU and Triton have PDL (`pdl_supported`), a kernel whose step times faster
    with it (here the output projection) keeps it in the table; elsewhere no launch with it is
    timed and the table holds none."""
    monkeypatch.setattr(tuner, "device_sm_count", lambda device: 132)
    monkeypatch.setattr(tuner, "pdl_supported", lambda device: has_pdl)

    class Bench(down_faster_at(0)):
        def time_ms(self, launch):
            self.table[self.key] = launch
            timed.append(launch)
            return 0.5 if self.key[0] == "o" and launch["pdl"] else 1.0

    timed = []
    table, results = tuner.tune(
        tiny_config, tiny_weights, FUSED, 60.0, "cpu", log=lambda line: None,
        bench=Bench, check=AnyLaunch,
    )  # fmt: skip
    os = [found for kernel, found in results if kernel == "o"]
    assert os and any(launch["pdl"] for launch in timed) == has_pdl
    if has_pdl:
        assert set(table) == {("o", f.bucket.rows) for f in os}
        assert all(table[key]["pdl"] is True for key in table)
    else:
        assert table == {}


def test_the_search_times_the_launch_the_engine_runs(
    tiny_config, tiny_weights, monkeypatch, patch_engine
):
    """The bench's table is the one the engine reads: a fake bench that times what the engine's
    own head launches (its kernel recorded, not run) finds the head faster at another BLOCK_N
    at every rows bucket. Timing a copy of the table, the engine ran the rules' launch for
    every candidate and the search kept the rules everywhere."""
    monkeypatch.setattr(tuner, "device_sm_count", lambda device: 132)
    spec = ModelSpec.from_config(tiny_config)
    prior = {tuner.prior_launch("head", rows, spec, 132, False)["block_n"] for rows in (1, 64)}
    fast = next(n for n in tuner.VALUES["block_n"] if n not in prior)

    class Bench(down_faster_at(fast)):
        def __init__(self, engine, bucket, check, vocab, table, key):
            super().__init__(engine, bucket, check, vocab, table, key)
            self.engine, self.rows, self.launched = engine, bucket.rows, []

            def launch(x, w, *args, tiles=None, **kwargs):
                self.launched.append(tiles)
                return torch.zeros(x.shape[0], w.shape[0])

            patch_engine(engine, "few_row_linear", launch)

        def time_ms(self, launch):
            self.table[self.key] = launch
            if self.key[0] != "head":
                return 1.0
            model = self.engine.model
            x = torch.zeros(self.rows, spec.hidden_size, dtype=model.dtype)
            model.output_logits(x, model.weights.norm, model.weights.head)
            return 0.5 if self.launched[-1][0] == fast else 1.0

    table, results = tuner.tune(
        tiny_config, tiny_weights, FUSED, 60.0, "cpu", log=lambda line: None,
        bench=Bench, check=AnyLaunch,
    )  # fmt: skip
    heads = [found for kernel, found in results if kernel == "head"]
    assert heads and set(table) == {("head", f.bucket.rows) for f in heads}
    assert all(table["head", f.bucket.rows]["tiles"][0] == fast for f in heads)


def test_the_rules_search_descends_again_from_the_neutral_launch(
    tiny_config, tiny_weights, monkeypatch
):
    """From the hand rules, each kernel bucket's search also descends from the neutral prior's
    launch once its own descent ended: the down projection is faster there alone, which no
    knob moved alone from the rules' reaches (three knobs differ)."""
    monkeypatch.setattr(tuner, "device_sm_count", lambda device: 132)
    spec = ModelSpec.from_config(tiny_config)

    def neutral(rows):
        return tuner.launch_of(tuner.prior_launch("down", rows, spec, 132, False, "neutral"))

    hand, other = (tuner.prior_launch("down", 8, spec, 132, False, p) for p in ("hand", "neutral"))
    assert sum(hand[k] != other[k] for k in hand) >= 2

    class Bench(down_faster_at(32)):
        def time_ms(self, launch):
            self.table[self.key] = launch
            return 0.5 if self.key[0] == "down" and launch == neutral(self.key[1]) else 1.0

    table, results = tuner.tune(
        tiny_config, tiny_weights, FUSED, 60.0, "cpu", log=lambda line: None,
        bench=Bench, check=AnyLaunch,
    )  # fmt: skip
    downs = [found for kernel, found in results if kernel == "down"]
    assert downs and all(table["down", f.bucket.rows] == neutral(f.bucket.rows) for f in downs)


def test_a_bucket_starts_from_what_its_nearest_searched_rows_found(
    tiny_config, tiny_weights, monkeypatch
):
    """Once the down projection moved at one row bucket, the next bucket tries that launch right
    after its prior, before its own descent (from the neutral prior a minute did not reach every
    bucket); what did not move seeds nothing, and the nearest row counts come first."""
    monkeypatch.setattr(tuner, "device_sm_count", lambda device: 132)
    timed: list = []

    class Bench(down_faster_at(32)):
        def time_ms(self, launch):
            timed.append((self.key, dict(launch)))
            return super().time_ms(launch)

    table, results = tuner.tune(
        tiny_config, tiny_weights, FUSED, 60.0, "cpu", log=lambda line: None,
        bench=Bench, check=AnyLaunch,
    )  # fmt: skip
    downs = [found for kernel, found in results if kernel == "down"]
    assert len(downs) > 1
    for found in downs[1:]:
        key = ("down", found.bucket.rows)
        mine = [launch for k, launch in timed if k == key]
        assert mine[1]["tiles"][0] == 32 and mine[1] == table[key]  # the seed, then the descent
    assert tuner.seeds("qkv", 8, results) == ()  # nothing moved
    rows = [f.bucket.rows for f in downs]
    nearest = [r.bucket.rows for r in sorted(downs, key=lambda f: abs(f.bucket.rows - 16))]
    assert len(tuner.seeds("down", 16, results, most=len(rows))) == len(rows)
    assert tuner.seeds("down", 16, results, most=1) == (table["down", nearest[0]],) or (
        table["down", nearest[0]] == table["down", nearest[1]]
    )


def test_a_seed_faster_than_the_prior_is_where_the_descent_starts(course, fake_bench):
    _, spec = course
    bucket = decode_attention.Bucket(8, 1024, (131,) * 8, 1)
    prior = tuner.prior_launch("down", 8, spec, 132, False)
    seed, warps = {**prior, "block_n": 64}, 8 if prior["warps"] != 8 else 2
    bench = fake_bench({("block_n", 64): 0.3, ("warps", warps): 0.2})
    found = decode_attention.tune_bucket(
        bench, prior, spec, bucket, 132, time.monotonic() + 60, tuner.AXES,
        functools.partial(tuner.candidates, "down"), seeds=(prior, seed),
    )  # fmt: skip
    assert bench.timed[1] == seed  # the prior (the same seed is not timed twice), then the seed
    assert found.best == {**seed, "warps": warps} and found.moved == {"block_n": 64, "warps": warps}
    refused = fake_bench({("block_n", 64): 0.3}, refused=[("block_n", 64)])
    found = decode_attention.tune_bucket(
        refused, prior, spec, bucket, 132, time.monotonic() + 60, tuner.AXES,
        functools.partial(tuner.candidates, "down"), seeds=(seed,),
    )  # fmt: skip
    assert found.best == prior and found.rejected[0][0] == seed


@pytest.mark.parametrize(
    "variant,why",
    [
        ({"layers": "triton", "graphs": "pow2"}, "run no few-row kernels"),
        ({"layers": "fused", "graphs": "off"}, "needs graphs"),
        (
            {"layers": "fused", "graphs": "pow2", "attention": "sdpa"},
            "needs graphs and our attention",
        ),
    ],
)
def test_the_command_refuses_a_variant_it_cannot_search(variant, why, capsys):
    with pytest.raises(SystemExit) as exit_:
        tuner.main(["--variant", json.dumps({**FUSED.to_dict(), **variant})])
    assert exit_.value.code == 2 and why in capsys.readouterr().err


def test_a_table_an_older_search_cached_is_searched_again(tiny_config, tmp_path, monkeypatch):
    """A cached table whose key lacks this search's version (the tables cached before the bench
    timed the engine's own table: the rules' launch everywhere) is not served."""
    key = {"gpu": "a GPU", "layout": "slab"}
    monkeypatch.setattr(tuner, "machine_key", lambda *args: dict(key))
    old = {**key, "kernels": "few_row"}
    decode_attention.write_cache(
        decode_attention.cache_path(tmp_path, old, "few_row"), {"key": old, "table": {}}
    )
    found = {("head", 1): dict(ODD)}
    monkeypatch.setattr(tuner, "tune", lambda *args, **kwargs: (found, []))
    table, _, path = tuner.load_or_tune(tiny_config, "unused", FUSED, tmp_path, device="cpu")
    assert table == found and json.loads(path.read_text())["key"]["search"] == tuner.SEARCH_VERSION


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_short_search_is_cached_and_its_engine_passes_the_gate(
    tiny_config, tiny_weights, tmp_path
):
    from evaluator.correctness import check_engine

    variant = Variant(cache="slab", attention="triton", layers="fused", graphs="pow2")
    table, results, path = tuner.load_or_tune(tiny_config, tiny_weights, variant, tmp_path, 20.0)
    assert path.is_file() and results and all(r["best_us"] <= r["prior_us"] for r in results)
    started = time.monotonic()
    again = tuner.load_or_tune(tiny_config, tiny_weights, variant, tmp_path, 20.0)
    assert again[0] == table and time.monotonic() - started < 5  # from the cache
    module = load_engine_module(render_engine(variant, tmp_path / "e.py", few_row_knobs=table))
    checked = check_engine(module.create_engine, tiny_config, tiny_weights, "cuda")
    assert all(case["passed"] for case in checked.values()), checked


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_neutral_prior_is_unsplit_neutral_tiles_that_compute_right(tiny_config, kernel):
    """No rule of the H200's: NEUTRAL_TILES (fitted to shared memory as the rules' are), one
    split, at every row count; the kernel computes right with them (float32 reference)."""
    spec = ModelSpec.from_config(tiny_config)
    for rows in (1, 3, 16):
        launch = tuner.prior_launch(kernel, rows, spec, 4, False, "neutral")
        assert launch["split_k"] == 1
        assert [launch[a] for a in tuner.TILE_AXES] == list(tuner.NEUTRAL_TILES)
    check = tuner.FewRowCheck(kernel, spec, 3, torch.device("cpu"), torch.float32, False, 4)
    neutral = tuner.launch_of(tuner.prior_launch(kernel, 3, spec, 4, False, "neutral"))
    assert check.error(neutral) < 1e-4


def test_a_neutral_search_returns_every_bucket_s_launch(tiny_config, tiny_weights, monkeypatch):
    """With the neutral prior the table is whole: every kernel at every decode graph row
    bucket, the neutral launch where nothing beat it (the engine then runs no hand rule), the
    searched launch where one did (the down projection at 16 columns, here)."""
    monkeypatch.setattr(tuner, "device_sm_count", lambda device: 132)
    spec = ModelSpec.from_config(tiny_config)
    whole = tuner.prior_table(spec, FUSED, "neutral", "cpu")
    assert tuner.prior_table(spec, FUSED, "hand", "cpu") == {}  # the hand rules: the launchers'
    assert {rows for _, rows in whole} == {1, 2, 4, 8, 16, 32, 64}
    assert set(whole) == {(k, r) for _, r in whole for k in tuner.kernels_at(r, False)}
    table, results = tuner.tune(
        tiny_config, tiny_weights, FUSED, 60.0, "cpu", log=lambda line: None,
        bench=down_faster_at(16), check=AnyLaunch, prior="neutral",
    )  # fmt: skip
    searched = {(kernel, found.bucket.rows) for kernel, found in results}
    assert set(table) == set(whole) and searched <= set(table)
    for key, launch in table.items():
        moved = key[0] == "down" and key in searched
        assert launch["tiles"][0] == (16 if moved else whole[key]["tiles"][0]), key
        assert launch == whole[key] or moved
