"""The prefill attention's tile search: the buckets the traces' prefill calls reach, the prior is
the launcher's own launch, the candidates, the search's gate (a wrong or refused launch never
wins), the table through the engine, its file and JSON, and the search's loop with fake timers
(the real one times a GPU)."""

import json
import time

import pytest
import torch

from evaluator.benchmark_traces import SUITES
from evaluator.engine_loader import load_engine_module
from evaluator.reference_model import ReferenceModel
from evaluator.traces import Prefill
from tuning import decode_attention
from tuning import prefill_attention as tuner
from variants.build import build_engine
from variants.kernels import prefill_attention as kernel
from variants.presets import PRESETS
from variants.render import render_engine, render_source
from variants.spec import ModelSpec
from variants.variant import Variant

OURS = Variant(cache="slab", attention="triton")  # runs on the CPU (eager prefill)
H200_SHARED, RTX3090_SHARED = 232448, 101376  # bytes a program may take
# tiles no rule picks, valid at the tiny model's head size
ODD = {"tiles": (16, 32, 2, 2)}


def test_every_prefill_call_a_graph_runs_falls_in_its_smallest_bucket(course):
    config, _ = course
    buckets = tuner.graph_buckets()
    found = tuner.prefill_buckets(config, buckets)
    assert buckets[0] == 16 and buckets[-1] == 8192
    calls = [
        (op.lengths, trace.prefill_tokens)
        for suite in SUITES.values()
        for trace in suite(config)
        for op in trace.ops
        if isinstance(op, Prefill)
    ]
    ran = [(lengths, total) for lengths, total in calls if sum(lengths) <= 8192]
    assert len(ran) < len(calls)  # wide_decode's 64 x 256 and a few admissions run eagerly
    assert sum(b.calls for b in found) == len(ran)
    assert sum(b.weight for b in found) == pytest.approx(sum(sum(ls) / t for ls, t in ran))
    assert [b.weight for b in found] == sorted((b.weight for b in found), reverse=True)
    for b in found:
        assert b.tokens in buckets and sum(b.lengths) <= b.tokens
        smaller = [t for t in buckets if t < b.tokens]
        assert not smaller or sum(b.lengths) > smaller[-1]  # the smallest that holds it
        assert any(lengths == b.lengths for lengths, _ in ran)
    public = {b.tokens for b in found}
    assert {256, 512, 1024, 8192} <= public  # decode 8x32, prefill 4x128, 8x128, long prompts


@pytest.fixture
def recorded(monkeypatch, launch_recorder):
    """The prefill kernel's launches (grid and every argument but the tensors), none run."""
    launches, Recorder = launch_recorder
    monkeypatch.setattr(kernel, "_varlen_prefill_kernel", Recorder())
    return launches


@pytest.mark.parametrize("capability", [(0, 0), (8, 6), (9, 0)])
def test_the_prior_is_the_launch_the_launcher_makes(course, recorded, monkeypatch, capability):
    """At the course's shapes, each bucket's call launched by default and with the prior's
    tiles: the same grid, tiles, warps and stages (recorded, not run)."""
    _, spec = course
    monkeypatch.setattr(kernel, "device_capability", lambda device: capability)
    for t in tuner.graph_buckets():
        q = torch.zeros(t, spec.num_heads, spec.head_dim, dtype=torch.float16)
        k = torch.zeros(t, spec.num_kv_heads, spec.head_dim, dtype=torch.float16)
        cu, schedule = torch.tensor([0, t], dtype=torch.int32), torch.zeros(2, 70)
        launch = tuner.launch_of(tuner.prior_launch(spec, t, capability))
        recorded.clear()
        kernel.varlen_prefill_attention(q, k, k, cu, t, 0.1, schedule)
        kernel.varlen_prefill_attention(q, k, k, cu, t, 0.1, schedule, **launch)
        assert len(recorded) == 2 and recorded[0] == recorded[1], t


@pytest.mark.parametrize("capability,shared", [((8, 6), RTX3090_SHARED), ((9, 0), H200_SHARED)])
def test_candidates_start_at_the_current_value_and_fit(course, capability, shared):
    config, spec = course
    for bucket in tuner.prefill_buckets(config, tuner.graph_buckets()):
        prior = tuner.prior_launch(spec, bucket.tokens, capability)
        assert tuner.fits(prior, spec, shared)  # the rules' own tiles fit where they are used
        tallest = max(16, 1 << (max(bucket.lengths) - 1).bit_length())
        for axis in tuner.AXES:
            values = tuner.candidates(shared, axis, prior, spec, bucket, 132)
            first = tuple(prior[k] for k in axis) if axis == tuner.PROGRAM else prior[axis]
            assert values[0] == first and len(values) == len(set(values)) > 1
            for value in values:
                knobs = {**prior, **decode_attention.knobs_at(axis, value)}
                assert all(knobs[k] in tuner.VALUES[k] for k in tuner.KNOBS)
                assert knobs["block_m"] <= max(tallest, prior["block_m"])
                assert value == values[0] or tuner.fits(knobs, spec, shared)


def test_the_filter_drops_spilling_and_oversized_tiles(course):
    """At head_dim 192 (two parts, 192 wide): 128 rows need 8 warps; four stages of 128-key
    tiles take more than the H200's shared memory, two stages of them fit the RTX 3090's."""
    _, spec = course
    tile = dict(zip(tuner.KNOBS, (128, 64, 8, 3)))
    assert tuner.fits(tile, spec, H200_SHARED)
    assert not tuner.fits({**tile, "warps": 4}, spec, H200_SHARED)  # 192 values a thread
    assert not tuner.fits({**tile, "block_n": 128, "stages": 4}, spec, H200_SHARED)
    assert tuner.fits({**tile, "block_n": 128, "stages": 2}, spec, RTX3090_SHARED)
    assert not tuner.fits({**tile, "block_n": 128, "stages": 3}, spec, RTX3090_SHARED)


def test_the_table_round_trips_json():
    table = {512: {"tiles": (32, 64, 4, 3)}, 8192: {"tiles": (128, 128, 8, 2)}}
    assert tuner.table_from_json(json.loads(json.dumps(tuner.table_to_json(table)))) == table


def search(spec, bench, bucket, capability=(9, 0), shared=H200_SHARED):
    prior = tuner.prior_launch(spec, bucket.tokens, capability)
    values = lambda *args: tuner.candidates(shared, *args)  # noqa: E731
    found = decode_attention.tune_bucket(
        bench, prior, spec, bucket, 132, time.monotonic() + 60, tuner.AXES, values
    )
    return prior, found


BUCKET = tuner.PrefillBucket(1024, (128,) * 8, 3, 1.4)  # decode_8x128's


def test_the_search_moves_rows_and_warps_together_and_keeps_the_prior_on_ties(course, fake_bench):
    _, spec = course
    prior, found = search(spec, fake_bench({}), BUCKET)  # every launch as fast as the prior
    assert found.best == prior and found.tried > 10
    faster = {("block_m", 128): 0.2, ("block_n", 128): 0.1, ("stages", 4): 0.005}
    prior, found = search(spec, fake_bench(faster), BUCKET)
    # 128 rows at the rules' 4 warps would spill: tried at 8; four stages are within the margin
    assert found.moved == {"block_m": 128, "warps": 8, "block_n": 128}
    assert found.best_ms == pytest.approx(0.7) and found.prior_ms == pytest.approx(1.0)


NEUTRAL_8192 = dict(zip(tuner.KNOBS, (32, 32, 8, 2)))  # the neutral prior's launch at 8,192


def from_neutral_at_8192(spec, bench):
    """The search of long_prompts' bucket (4 prompts of 2,048) from the neutral launch, checked
    to time no launch twice."""
    bucket = tuner.PrefillBucket(8192, (2048,) * 4, 1, 1.0)
    values = lambda *args: tuner.candidates(H200_SHARED, *args)  # noqa: E731
    found = decode_attention.tune_bucket(
        bench, NEUTRAL_8192, spec, bucket, 132, time.monotonic() + 60, tuner.AXES, values
    )
    timed = [tuple(sorted(k.items())) for k in bench.timed[1:-2]]  # (the prior, the re-check)
    assert len(timed) == len(set(timed))
    return found


def test_a_knob_that_wins_only_after_another_moved_is_found_in_a_second_pass(course, fake_bench):
    """The neutral prior's case at 8192 tokens (one pass left the prefill 11 % slower than the
    rules on long_prompts): from 32-row blocks at 32-key tiles, 128-row blocks lose until the
    key tiles are 128 wide, which the first pass finds after the rows were tried."""
    _, spec = course

    class Coupled(fake_bench):
        def time_ms(self, knobs):
            self.timed.append(dict(knobs))
            tall, wide = knobs["block_m"] == 128, knobs["block_n"] == 128
            return 1.0 - 0.2 * wide - (0.4 if tall and wide else -0.1 if tall else 0.0)

    found = from_neutral_at_8192(spec, Coupled({}))
    assert found.best == {**NEUTRAL_8192, "block_m": 128, "block_n": 128} and found.best_ms == 0.4


def test_a_restart_finds_the_optimum_no_single_knob_leads_to(course, fake_bench):
    """The rules' launch a local optimum (three knobs must move, more than a pair), the neutral
    one a knob away from the fastest: the descent from it, after the first has ended, finds the
    fastest, which is kept."""
    _, spec = course

    class TwoSlopes(fake_bench):
        def time_ms(self, knobs):
            self.timed.append(dict(knobs))
            fastest = (knobs["block_m"], knobs["block_n"], knobs["stages"]) == (32, 32, 4)
            return 0.6 if fastest else 1.0

    prior, neutral = dict(zip(tuner.KNOBS, (64, 64, 4, 3))), dict(zip(tuner.KNOBS, (32, 32, 8, 2)))
    values = lambda *args: tuner.candidates(H200_SHARED, *args)  # noqa: E731
    bucket = tuner.PrefillBucket(1024, (128,) * 8, 3, 1.4)

    def run(restarts):
        return decode_attention.tune_bucket(
            TwoSlopes({}), prior, spec, bucket, 132, time.monotonic() + 60, tuner.AXES, values,
            restarts=restarts,
        )  # fmt: skip

    assert run(()).best == prior  # one descent: the rules kept
    found = run((neutral,))
    assert found.best == {**neutral, "stages": 4} and found.best_ms == pytest.approx(0.6)
    stale = run((prior,))  # a restart already tried starts nothing
    assert stale.best == prior and stale.tried == run(()).tried


def test_a_launch_two_knobs_away_is_found_by_moving_a_pair(course, fake_bench):
    """The neutral prior's case at 8,192 tokens: the descent ends at 32-row blocks, 128-key
    tiles; 128-row blocks are refused there (the H200's shared memory) and lose at the 32-row
    blocks' 64-key tiles, so no single knob reaches 128 rows at 64-key tiles, the fastest."""
    _, spec = course

    class Pair(fake_bench):
        def time_ms(self, knobs):
            self.timed.append(dict(knobs))
            tall, keys = knobs["block_m"] == 128, knobs["block_n"]
            if tall and keys == 64:
                return 0.35
            return 1.0 - 0.5 * (keys == 128) + 0.2 * tall

        def error(self, knobs):
            if knobs["block_m"] == 128 and knobs["block_n"] == 128:
                raise RuntimeError("out of resource: shared memory")
            return super().error(knobs)

    found = from_neutral_at_8192(spec, Pair({}))
    assert found.best == {**NEUTRAL_8192, "block_m": 128, "block_n": 64} and found.best_ms == 0.35


def test_a_refused_launch_is_rejected_not_fatal(course, fake_bench):
    _, spec = course
    bench = fake_bench({("stages", 2): 0.5}, refused=[("stages", 2)])
    prior, found = search(spec, bench, BUCKET)
    assert found.best == prior
    assert any("shared memory" in str(err) for _, err in found.rejected)


def test_a_planted_wrong_launch_is_rejected_by_the_float32_check(
    tiny_config, monkeypatch, fake_bench
):
    """Through Triton's interpreter: the real kernel checked against the reference on three
    packed prompts with padding rows after them; its launcher corrupted at 32-key tiles, which
    the fake timer makes the fastest by far. Without the check they would win."""
    spec = ModelSpec.from_config(tiny_config)
    real = tuner.varlen_prefill_attention

    def planted(*args, tiles=None, **kwargs):
        out = real(*args, tiles=tiles, **kwargs)
        return out + 0.5 if tiles[1] == 32 else out  # (a key tile lost, say)

    monkeypatch.setattr(tuner, "varlen_prefill_attention", planted)
    bucket = tuner.PrefillBucket(64, (37, 5, 20), 1, 1.0)
    check = tuner.PrefillCheck(spec, bucket, torch.device("cpu"), torch.float32, most_prompts=4)

    class Timed(fake_bench):
        def error(self, knobs):
            return check.error(knobs)

    bench = Timed({("block_m", 32): 0.1, ("block_n", 32): 0.5})
    prior, found = search(spec, bench, bucket, capability=(0, 0))
    assert prior == dict(zip(tuner.KNOBS, (64, 64, 4, 2))) and check.error(prior) < 1e-4
    assert found.best == {**prior, "block_m": 32, "warps": 2}  # the right, faster q-blocks kept
    assert any(knobs["block_n"] == 32 for knobs, _ in found.rejected)
    assert all(t["block_n"] != 32 for t in bench.timed)  # rejected before it is timed


def test_the_check_passes_right_tiles_and_catches_unwritten_rows(tiny_config, monkeypatch):
    """Right tiles of every q-block height pass. A schedule built for taller q-blocks than the
    launch's leaves rows unwritten: caught on every call, even where each output is given the
    memory of the one before, a right one (the allocator's worst case, planted)."""
    spec = ModelSpec.from_config(tiny_config)
    bucket = tuner.PrefillBucket(64, (37, 5, 20), 1, 1.0)
    check = tuner.PrefillCheck(spec, bucket, torch.device("cpu"), torch.float32, most_prompts=4)
    prior = tuner.prior_launch(spec, 64, (0, 0))
    for block_m, block_n in ((16, 32), (32, 16), (64, 128), (16, 16)):
        assert check.error({**prior, "block_m": block_m, "block_n": block_n}) < 1e-4
    check.schedules[16] = check.schedule(32)  # a planted fault: 16-row blocks, 32's table
    outputs, empty = {}, torch.empty

    def recycled(*shape, **kwargs):
        return outputs.setdefault((shape, kwargs.get("dtype")), empty(*shape, **kwargs))

    monkeypatch.setattr(kernel.torch, "empty", recycled)
    for _ in range(3):
        assert check.error(prior) < 1e-4
        assert not check.error({**prior, "block_m": 16}) < 1e-2  # (a NaN fails too)
    assert len(outputs) == 1  # the launcher's output, the same memory every call
    # builds between the checks (the search builds a knob's candidates before checking them)
    # write zeros where they write, draw no sign and leave the fault caught
    for _ in range(3):
        assert check.error(prior) < 1e-4
        check.build(prior)
        assert not next(iter(outputs.values()))[: check.starts[-1]].abs().any()
        check.build({**prior, "block_m": 16})
        assert not check.error({**prior, "block_m": 16}) < 1e-2


def _scenario(engine, ref, vocab) -> float:
    """Prefill three prompts (46 tokens), then one (9 tokens), decode the four rows: the largest
    gap to the reference."""
    gen = torch.Generator().manual_seed(5)
    history: dict = {}
    worst = 0.0
    for call in ({7: 5, 3: 40, 11: 1}, {4: 9}):
        prompts = {r: torch.randint(0, vocab, (n,), generator=gen) for r, n in call.items()}
        out = engine.prefill(list(prompts), list(prompts.values()))
        history.update(prompts)
        for i, prompt in enumerate(prompts.values()):
            worst = max(worst, (out[i] - ref.forward(prompt[None])[0, -1]).abs().max().item())
    ids = sorted(history)
    tokens = torch.randint(0, vocab, (len(ids),), generator=gen)
    out = engine.decode(ids, tokens)
    for i, rid in enumerate(ids):
        want = ref.forward(torch.cat([history[rid], tokens[i : i + 1]])[None])[0, -1]
        worst = max(worst, (out[i] - want).abs().max().item())
    return worst


def test_an_engine_with_a_table_launches_it_and_matches_the_reference(
    tiny_config, sharp_weights, engine_prefill_launches
):
    """Eagerly on the CPU: a call of as many tokens as a table's entry launches its tiles, any
    other the rules'."""
    engine = build_engine(tiny_config, sharp_weights, "cpu", OURS, prefill_knobs={46: ODD})
    assert engine.model.attention.prefill_knobs == {46: ODD}
    prefill_launches = engine_prefill_launches(engine)
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    assert _scenario(engine, ref, tiny_config["vocab_size"]) < 1e-4
    assert prefill_launches == [(46, ODD["tiles"])] * 2 + [(9, None)] * 2  # two layers a call


def test_the_table_is_written_into_the_engine_which_matches_the_library(written_engine):
    table = {46: dict(ODD), 512: {"tiles": (32, 64, 4, 3)}}
    text, module, gaps = written_engine(OURS, _scenario, prefill_knobs=table)
    assert text.count("PREFILL_ATTENTION_KNOBS = {") == 1
    assert "    512: dict(tiles=(32, 64, 4, 3)),\n" in text
    assert "functools.partial(TritonAttention, prefill_knobs=PREFILL_ATTENTION_KNOBS)" in text
    assert module.PREFILL_ATTENTION_KNOBS == table
    assert gaps[0] == gaps[1] and gaps[0] < 1e-4  # the same engine, right


def test_without_a_table_the_fastest_engine_is_unchanged(kernel_lines):
    fastest = PRESETS["slab-triton-pdl-allgraphs"]
    text = render_source(fastest)
    assert render_source(fastest, prefill_knobs={}) == text
    assert "PREFILL_ATTENTION_KNOBS" not in text
    assert "attention_cls=TritonAttention," in text
    decode = {(8, 1024): {"num_splits": 4}}
    tuned = render_source(fastest, knobs=decode, prefill_knobs={512: {"tiles": (32, 64, 4, 3)}})
    # every kernel keeps its line (Triton's cache key holds it): the tables go after them
    assert kernel_lines(tuned) == kernel_lines(text) and len(kernel_lines(text)) > 10
    assert "            knobs=DECODE_ATTENTION_KNOBS,\n" in tuned
    assert "            prefill_knobs=PREFILL_ATTENTION_KNOBS,\n" in tuned


@pytest.mark.parametrize("preset", ["slab-sdpa", "slab-sdpa-graphs"])
def test_an_engine_without_our_attention_carries_no_table(preset):
    """The CPU's engine (eager SDPA) and SDPA's graphs: the same file with a table or without."""
    table = {46: dict(ODD)}
    text = render_source(PRESETS[preset], weights="course")
    assert render_source(PRESETS[preset], weights="course", prefill_knobs=table) == text


class BucketCheck:
    """A fake PrefillCheck: its bucket alone."""

    def __init__(self, spec, bucket, device, dtype):
        self.bucket = bucket


def timed_by(time_ms):
    """A fake GraphBench whose launches all pass and take `time_ms(bucket, knobs)`."""

    class Bench:
        def __init__(self, check, layers):
            self.bucket = check.bucket

        def error(self, knobs):
            return 0.0

        def build(self, knobs):
            pass

        def time_ms(self, knobs):
            return time_ms(self.bucket, knobs)

    return Bench


def test_the_search_loop_keeps_only_what_moved(tiny_config, monkeypatch):
    """tune() on the CPU with a fake bench and check: 32-key tiles are faster at the heaviest
    bucket alone, the rest ties; the table holds that bucket's tiles alone."""
    made, heaviest = [], tuner.prefill_buckets(tiny_config, tuner.graph_buckets())[0]

    class Check:
        def __init__(self, spec, bucket, device, dtype):
            self.bucket = bucket
            made.append(bucket.tokens)

    class Bench:
        def __init__(self, check, layers):
            self.bucket, self.layers = check.bucket, layers

        def error(self, knobs):
            return 0.0

        def build(self, knobs):
            pass

        def time_ms(self, knobs):
            fast = self.bucket == heaviest and knobs["block_n"] == 32
            return 0.5 if fast else 1.0

    monkeypatch.setattr(tuner, "shared_memory", lambda device: H200_SHARED)
    table, results = tuner.tune(
        tiny_config, 60.0, "cpu", log=lambda line: None, bench=Bench, check=Check
    )
    assert made == [b.tokens for b in tuner.prefill_buckets(tiny_config, tuner.graph_buckets())]
    assert [r.bucket for r in results][0] == heaviest and len(results) == len(made)
    assert table == {heaviest.tokens: {"tiles": (64, 32, 4, 2)}}  # the CPU's rules, 32 keys
    summary = tuner.summary(results)
    assert summary[0]["moved"] == {"block_n": 32} and summary[0]["best_us"] == 500.0
    assert all(r["moved"] == {} and r["best_us"] == r["prior_us"] for r in summary[1:])


@pytest.mark.parametrize(
    "variant,why",
    [
        ({"attention": "sdpa"}, "needs our attention and prefill graphs"),
        ({"prefill_graphs": "off"}, "needs our attention and prefill graphs"),
    ],
)
def test_the_command_refuses_a_variant_it_cannot_search(variant, why, capsys):
    ours = PRESETS["slab-triton-pdl-allgraphs"].to_dict()
    with pytest.raises(SystemExit) as exit_:
        tuner.main(["--variant", json.dumps({**ours, **variant})])
    assert exit_.value.code == 2 and why in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's refusal")
def test_the_command_refuses_to_run_without_a_gpu(capsys):
    with pytest.raises(SystemExit) as exit_:
        tuner.main([])
    assert exit_.value.code == 2 and "no CUDA device here" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_short_search_is_cached_and_its_engine_passes_the_gate(
    tiny_config, tiny_weights, tmp_path
):
    from evaluator.correctness import check_engine

    variant = PRESETS["slab-triton-pdl-allgraphs"]
    table, results, path = tuner.load_or_tune(tiny_config, tmp_path, 20.0)
    assert path.is_file() and results and all(r["best_us"] <= r["prior_us"] for r in results)
    assert set(table) <= {r["tokens"] for r in results if r["moved"]}
    started = time.monotonic()
    again = tuner.load_or_tune(tiny_config, tmp_path, 20.0)
    assert again[0] == table and time.monotonic() - started < 5  # from the cache
    # with no tile moved, a table of the first bucket's other q-blocks: the gate still runs it
    table = table or {results[0]["tokens"]: {"tiles": (32, 64, 4, 2)}}
    module = load_engine_module(render_engine(variant, tmp_path / "e.py", prefill_knobs=table))
    checked = check_engine(module.create_engine, tiny_config, tiny_weights, "cuda")
    assert all(case["passed"] for case in checked.values()), checked


def test_the_rules_search_descends_again_from_the_neutral_tiles(tiny_config, monkeypatch):
    """From the hand rules (an H200's, here), each bucket's search also descends from the
    neutral prior's tiles once its own descent ended: at the heaviest bucket only those tiles
    are faster, and no knob alone leads there from the rules' (rows and stages differ)."""
    heaviest = tuner.prefill_buckets(tiny_config, tuner.graph_buckets())[0]
    spec = ModelSpec.from_config(tiny_config)
    hopper = tuner.prior_launch(spec, heaviest.tokens, (9, 0))
    neutral = tuner.prior_launch(spec, heaviest.tokens, decode_attention.NEUTRAL)
    differ = {k for k in tuner.KNOBS if hopper[k] != neutral[k]}
    assert len(differ) >= 2 and "stages" in differ

    bench = timed_by(lambda bucket, knobs: 0.5 if (bucket, knobs) == (heaviest, neutral) else 1.0)
    monkeypatch.setattr(tuner, "shared_memory", lambda device: H200_SHARED)
    monkeypatch.setattr(tuner, "device_capability", lambda device: (9, 0))
    table, results = tuner.tune(
        tiny_config, 60.0, "cpu", log=lambda line: None, bench=bench, check=BucketCheck
    )
    assert table == {heaviest.tokens: tuner.launch_of(neutral)}
    assert results[0].prior == hopper and results[0].best == neutral


def test_a_neutral_search_returns_every_bucket_s_tiles(tiny_config, monkeypatch):
    """With the neutral prior every prefill graph bucket is in the table: the tiles of a GPU
    nothing was measured on (capability NEUTRAL, whatever this one is) where nothing beat them,
    the searched tiles where something did (32-key tiles at the heaviest bucket, here)."""
    heaviest = tuner.prefill_buckets(tiny_config, tuner.graph_buckets())[0]

    bench = timed_by(
        lambda bucket, knobs: 0.5 if bucket == heaviest and knobs["block_n"] == 32 else 1.0
    )
    spec = ModelSpec.from_config(tiny_config)
    whole = tuner.prior_table(spec, "neutral")
    assert tuner.prior_table(spec, "hand") == {}  # the hand rules: the launcher's own
    assert sorted(whole) == tuner.graph_buckets()
    neutral = {t: tuner.launch_of(tuner.prior_launch(spec, t, decode_attention.NEUTRAL))
               for t in whole}  # fmt: skip
    assert whole == neutral
    monkeypatch.setattr(tuner, "shared_memory", lambda device: H200_SHARED)
    monkeypatch.setattr(tuner, "device_capability", lambda device: (9, 0))  # not used: neutral
    table, results = tuner.tune(
        tiny_config, 60.0, "cpu", log=lambda line: None, bench=bench, check=BucketCheck,
        prior="neutral",
    )  # fmt: skip
    assert set(table) == set(whole) and results
    assert table[heaviest.tokens]["tiles"][1] == 32  # (BLOCK_M, BLOCK_N, warps, stages)
    assert all(table[t] == whole[t] for t in whole if t != heaviest.tokens)
    assert results[0].prior == tuner.prior_launch(spec, heaviest.tokens, decode_attention.NEUTRAL)
