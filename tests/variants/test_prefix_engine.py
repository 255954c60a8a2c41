"""The prefix-caching engine against the reference model: prompts sharing a system prefix of 1, 2
or 3 full blocks (and a partial one) compute only their suffix and give the reference's logits,
through decode, remove, re-prefill and a full pool; the rendered standalone file does the same
and passes the course gate."""

import dataclasses
import importlib.util

import pytest
import torch

from evaluator.correctness import check_prepared, prepare_check
from evaluator.gates import CourseGate
from evaluator.reference_model import ReferenceModel
from variants import Variant, build_engine
from variants.cache.pool import pool_bytes
from variants.render import render_engine

BS = 16
# float32 on CPU: the suffix's arithmetic differs from the reference's by rounding only; a wrong
# position offset or mask moves the sharp weights' logits by far more (tests/variants/test_engine)
TOL = 5e-4
A, B, C, D = 10**9 + 7, 3, 10**12 + 1, 42
VARIANTS = [Variant(cache="paged", prefix_cache=True, attention=a) for a in ("sdpa", "manual")]


@pytest.fixture(scope="module")
def reference(tiny_config, sharp_weights):
    return ReferenceModel(tiny_config, sharp_weights, "cpu")


def ids(seed: int, n: int) -> list:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class Session:
    """An engine, the reference and each request's history: every call's logits are checked
    against the reference; a prefill returns the tokens it found cached and computed."""

    def __init__(self, engine, reference):
        self.engine, self.reference, self.history = engine, reference, {}

    def check(self, rids: list, out: torch.Tensor) -> None:
        assert out.shape == (len(rids), 256) and out.dtype == torch.float32
        for row, rid in zip(out, rids):
            want = self.reference.forward(torch.tensor([self.history[rid]]))[0, -1]
            err = (row - want).abs().max().item()
            assert err < TOL, f"request {rid} at length {len(self.history[rid])}: max |d| {err}"

    def prefill(self, rids: list, prompts: list) -> tuple:
        e = self.engine
        before = (e.cached_tokens, e.computed_tokens)
        out = e.prefill(rids, [torch.tensor(p) for p in prompts])
        self.history.update({r: list(p) for r, p in zip(rids, prompts)})
        self.check(rids, out)
        return e.cached_tokens - before[0], e.computed_tokens - before[1]

    def decode(self, rids: list, steps: int = 2) -> None:
        for step in range(steps):
            new = [(7 * step + len(self.history[r])) % 256 for r in rids]
            out = self.engine.decode(rids, torch.tensor(new))
            for r, t in zip(rids, new):
                self.history[r].append(t)
            self.check(rids, out)

    def remove(self, rids: list) -> None:
        self.engine.remove(rids)
        for r in rids:
            del self.history[r]


def shared_prefix_script(session: Session, shared_blocks: int) -> None:
    """A system prompt of `shared_blocks` full blocks and 5 tokens, then questions after it."""
    engine, cache = session.engine, session.engine.cache
    system = ids(1, shared_blocks * BS + 5)
    shared = shared_blocks * BS
    q = [ids(10 + i, n) for i, n in enumerate((7, 20, 1, 12))]
    assert session.prefill([A], [system + q[0]]) == (0, len(system) + 7)
    # two more in one call: each maps the system prompt's full blocks, computes the rest
    assert session.prefill([B, C], [system + q[1], system + q[2]]) == (2 * shared, 5 + 20 + 5 + 1)
    head = cache.table[A][:shared_blocks]
    assert cache.table[B][:shared_blocks] == head == cache.table[C][:shared_blocks]
    assert [cache.refs[b] for b in head] == [3] * shared_blocks
    session.decode([A, B, C], steps=3)
    session.remove([A])
    assert [cache.refs[b] for b in head] == [2] * shared_blocks
    # a re-prefill of a live id: it gives back its blocks, then maps the shared ones again
    assert session.prefill([B], [system + q[3]]) == (shared, 5 + 12)
    session.decode([C, B])
    session.remove([B, C])
    assert cache.refs == {} and engine.lengths == {}
    assert set(head) <= set(cache.evictable)  # released, still matchable
    assert session.prefill([D], [system + q[0]]) == (shared, 5 + 7)
    assert cache.table[D][:shared_blocks] == head
    session.decode([D])


@pytest.mark.parametrize("shared_blocks", [1, 2, 3])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_shared_prefix_matches_the_reference(
    tiny_config, sharp_weights, reference, variant, shared_blocks
):
    engine = build_engine(tiny_config, sharp_weights, "cpu", variant)
    assert type(engine).__name__ == "PrefixCachingEngine"
    shared_prefix_script(Session(engine, reference), shared_blocks)


@pytest.mark.parametrize("n, cached", [(3 * BS, 2 * BS), (2 * BS + 1, 2 * BS)])
def test_a_fully_cached_prompt_computes_its_last_token(
    tiny_config, sharp_weights, reference, n, cached
):
    """The last token's logits need a forward pass, and its block is never a shared one."""
    session = Session(build_engine(tiny_config, sharp_weights, "cpu", VARIANTS[0]), reference)
    prompt = ids(20, n)
    assert session.prefill([A], [prompt]) == (0, n)
    assert session.prefill([B], [prompt]) == (cached, n - cached)
    assert session.prefill([A], [prompt]) == (cached, n - cached)  # a re-prefill, the same
    session.decode([A, B])


def test_full_pool_evicts_then_refuses_and_changes_nothing(tiny_config, sharp_weights, reference):
    """A budget that holds the first pool only (4 blocks): released prompt blocks are evicted,
    oldest first, before a call is refused; a refused call leaves every request as it was."""
    variant = dataclasses.replace(VARIANTS[0], cache_tokens=4 * BS)
    probe = build_engine(tiny_config, sharp_weights, "cpu", variant)
    budget = probe.model.weights.nbytes() + pool_bytes(probe.spec, torch.float32, 5 * BS + BS // 2)
    engine = build_engine(
        tiny_config, sharp_weights, "cpu", variant, memory_budget_gib=budget / 2**30
    )
    session, cache = Session(engine, reference), engine.cache
    a = ids(30, 2 * BS + 1)
    assert session.prefill([A], [a]) == (0, 2 * BS + 1)
    session.remove([A])  # its 2 full blocks evictable, its last free
    assert session.prefill([B], [ids(31, 3 * BS)]) == (0, 3 * BS)  # evicts a's tail block
    before = (dict(engine.lengths), {r: list(t) for r, t in cache.table.items()}, cache.blocks)
    with pytest.raises(MemoryError):  # (the engine file's CacheFullError)
        session.engine.prefill([C], [torch.tensor(a)])  # 3 blocks, 1 left
    assert (dict(engine.lengths), {r: list(t) for r, t in cache.table.items()}, cache.blocks) == (
        before
    )
    assert cache.block_hashes(a)[0] in cache.block_of
    session.decode([B])  # position 48 starts a block: a's first block, the last evictable one
    assert not set(cache.block_hashes(a)) & set(cache.block_of) and cache.evictable == {}
    session.remove([B])
    assert session.prefill([C], [a]) == (0, 2 * BS + 1)  # the re-match misses


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_rendered_engine_caches_prefixes_and_passes_the_course_gate(
    tmp_path, tiny_config, sharp_weights, reference, variant
):
    path = render_engine(variant, tmp_path / "engine.py")
    text = path.read_text()
    assert "class PrefixCachingEngine(Engine)" in text
    assert "return assemble_prefix_caching_engine(" in text
    assert "import variants" not in text and "from variants" not in text
    spec = importlib.util.spec_from_file_location("rendered_prefix_engine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    engine = module.create_engine(tiny_config, sharp_weights, "cpu")
    assert type(engine).__name__ == "PrefixCachingEngine"
    shared_prefix_script(Session(engine, reference), 2)
    gate = prepare_check(CourseGate(atol=1e-2, rtol=1e-2), tiny_config, sharp_weights, "cpu")
    results = check_prepared(module.create_engine, gate)
    assert {case: r["passed"] for case, r in results.items()} == {"public": True, "stress": True}
