"""Programmatic dependent launch: refused with a reason where it cannot run; on a Hopper GPU each
decode-step kernel launched with it (weights prefetched or not) gives exactly the plain launch's
result, alone and in a CUDA graph of dependent launches, where a missing wait would race: the
fused layers' chain, and the Triton stack's kernels after cuBLAS projections."""

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels import pdl  # noqa: E402
from variants.kernels.decode_attention import paged_decode_attention  # noqa: E402
from variants.kernels.few_row_linear import few_row_linear  # noqa: E402
from variants.kernels.fused_norm import add_rms_norm  # noqa: E402
from variants.kernels.fused_rope import rope_and_cache_write  # noqa: E402
from variants.kernels.fused_silu import silu_mul  # noqa: E402
from variants.kernels.norm_qkv_rope import norm_qkv_rope  # noqa: E402
from variants.kernels.norm_swiglu import norm_swiglu  # noqa: E402


def test_plain_launch_adds_no_option():
    assert pdl.launch_options(False, "cpu") == {}


def test_refused_off_cuda_with_the_reason():
    assert not pdl.pdl_supported("cpu")
    with pytest.raises(ValueError, match="capability >= 9.0"):
        pdl.launch_options(True, "cpu")


def test_a_launcher_refuses_it_on_the_cpu():
    x = torch.randn(2, 32)
    with pytest.raises(ValueError, match="programmatic dependent launch"):
        few_row_linear(x, torch.randn(16, 32), pdl=True)


def _hopper():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if not pdl.pdl_supported("cuda"):
        pytest.skip("needs compute capability >= 9.0 and a Triton with launch_pdl")


def _half(*shape, scale=0.05):
    return (torch.randn(*shape, device="cuda") * scale).half()


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 16])
@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "wait-only"])
def test_gpu_each_kernel_matches_its_plain_launch(rows, prefetch):
    _hopper()
    h, inter, heads, d = 768, 3072, 4, 192
    x, norm = _half(rows, h, scale=1.0), 1 + _half(h)
    both = dict(pdl=True, prefetch=prefetch)
    for k, n in ((h, h), (inter, h), (h, 4096)):  # o-proj, the split down projection, the head
        w, xk, res = _half(n, k), _half(rows, k, scale=1.0), _half(rows, n)
        plain = few_row_linear(xk, w, residual=res)
        assert torch.equal(few_row_linear(xk, w, residual=res, **both), plain)
    gate_up = _half(2 * inter, h)
    plain = norm_swiglu(x, norm, gate_up, 1e-5)
    assert torch.equal(norm_swiglu(x, norm, gate_up, 1e-5, **both), plain)

    qkv, slots = _half(3 * heads * d, h), torch.arange(rows, device="cuda") * 3
    cos, sin = torch.rand(rows, d // 2, device="cuda"), torch.rand(rows, d // 2, device="cuda")
    pools = [torch.zeros(64, heads, d, device="cuda", dtype=torch.half) for _ in range(4)]
    args = (x, norm, qkv, 1e-5, d, heads * d, cos, sin)
    q_plain = norm_qkv_rope(*args, pools[0], pools[1], slots)
    q_pdl = norm_qkv_rope(*args, pools[2], pools[3], slots, **both)
    assert torch.equal(q_pdl, q_plain)
    assert torch.equal(pools[2], pools[0]) and torch.equal(pools[3], pools[1])


@pytest.mark.gpu
@pytest.mark.parametrize(
    "batch, ctx, splits",
    [(8, 150, 16), (4, 2100, 49), (1, 2100, 64)],
    ids=["short", "4-long", "1-long"],
)
@pytest.mark.parametrize("tiles_ahead", [None, 0, 1, 2, 4])
def test_gpu_attention_matches_its_plain_launch(batch, ctx, splits, tiles_ahead):
    """Whatever it prefetches (None: the launcher's rule), in short and long-context grids."""
    _hopper()
    heads, d = 4, 192
    q = _half(batch, heads, d, scale=1.0)
    k_pool, v_pool = _half(batch * ctx, heads, d, scale=1.0), _half(batch * ctx, heads, d)
    table = torch.arange(batch, device="cuda", dtype=torch.int32)[:, None]  # a slab: row b
    lens = torch.randint(1, ctx, (batch,), device="cuda", dtype=torch.int32)
    args = (q, k_pool, v_pool, table, lens, ctx, d**-0.5, splits)
    plain = paged_decode_attention(*args)
    got = paged_decode_attention(*args, pdl=True, prefetch_tiles=tiles_ahead)
    assert torch.equal(got, plain)


def test_prefetch_tiles_must_be_a_power_of_two():
    q, pool = torch.zeros(1, 4, 32), torch.zeros(8, 4, 32)
    table, lens = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(AssertionError, match="prefetch_tiles 3 must be 0 or a power of two"):
        paged_decode_attention(q, pool, pool, table, lens, 8, 1.0, 1, prefetch_tiles=3)


@pytest.mark.gpu
def test_gpu_a_graph_of_dependent_launches_matches_the_plain_chain():
    """A decode-step-like chain (each kernel reads the one before's output) 12 times over,
    captured with PDL and replayed 20 times: every replay equals the plain launches' result.
    Without the wait a kernel would read its input before the kernel before had written it."""
    _hopper()
    rows, h, inter = 8, 768, 3072
    norm, gate_up = 1 + _half(h), _half(2 * inter, h)
    o_w, down = _half(h, h, scale=0.01), _half(h, inter)  # x grows at most ~1.3x a round

    def chain(x, on):
        for _ in range(12):
            x = few_row_linear(x, o_w, residual=x, pdl=on)
            act = norm_swiglu(x, norm, gate_up, 1e-5, pdl=on)
            x = few_row_linear(act, down, residual=x, pdl=on)
        return x

    start = _half(rows, h, scale=1.0)
    want = chain(start, False)
    assert want.isfinite().all() and want.abs().max() > 1
    _graph_replays_match(chain, start, want)


def _graph_replays_match(chain, start, want):
    """`chain(x, pdl)` launched with PDL, captured in a CUDA graph and replayed 20 times: each
    replay gives exactly `want`, the plain launches' result from `start`."""
    static_in = start.clone()
    chain(static_in, True)  # compile before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = chain(static_in, True)
    for replay in range(20):
        graph.replay()
        torch.cuda.synchronize()
        gap = (static_out.float() - want.float()).abs().max().item()
        assert torch.equal(static_out, want), f"replay {replay}: off by up to {gap}"


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 64, 300])
def test_gpu_each_stack_kernel_matches_its_plain_launch(rows):
    """The Triton stack's own kernels (add + RMSNorm, RoPE + cache write, SiLU-mul)."""
    _hopper()
    h, inter, heads, d = 768, 3072, 4, 192
    x, delta, norm = _half(rows, h, scale=1.0), _half(rows, h, scale=1.0), 1 + _half(h)
    for a, b in zip(
        add_rms_norm(x, delta, norm, 1e-5), add_rms_norm(x, delta, norm, 1e-5, pdl=True)
    ):
        assert torch.equal(b, a)
    gate, up = _half(rows, inter, scale=2.0), _half(rows, inter, scale=2.0)
    assert torch.equal(silu_mul(gate, up, pdl=True), silu_mul(gate, up))
    q, k, v = (_half(rows, heads, d, scale=1.0) for _ in range(3))
    cos, sin = (
        torch.rand(rows, d // 2, device="cuda").half(),
        torch.rand(rows, d // 2, device="cuda").half(),
    )
    slots = torch.randperm(2 * rows, device="cuda")[:rows]
    pools = [torch.zeros(2 * rows, heads, d, device="cuda", dtype=torch.half) for _ in range(4)]
    k_out = [torch.empty(rows, heads, d, device="cuda", dtype=torch.half) for _ in range(2)]
    plain = rope_and_cache_write(q, k, v, cos, sin, pools[0], pools[1], slots, k_out=k_out[0])
    on = rope_and_cache_write(
        q, k, v, cos, sin, pools[2], pools[3], slots, k_out=k_out[1], pdl=True
    )
    assert torch.equal(on, plain) and torch.equal(k_out[1], k_out[0])
    assert torch.equal(pools[2], pools[0]) and torch.equal(pools[3], pools[1])


@pytest.mark.gpu
def test_gpu_stack_kernels_after_cublas_in_a_graph_match_the_plain_chain():
    """The Triton stack's shape of a layer, 12 times over: cuBLAS projections, each followed by
    one of our kernels launched with PDL (which must wait for the projection's output), captured
    and replayed 20 times against the plain launches."""
    _hopper()
    rows, h, inter = 64, 768, 3072
    norm, gate_up = 1 + _half(h), _half(2 * inter, h)
    o_w, down = _half(h, h, scale=0.02), _half(h, inter, scale=0.02)

    def chain(x, on):
        x, normed = add_rms_norm(x, None, norm, 1e-5, pdl=on)
        for _ in range(12):
            x, normed = add_rms_norm(x, torch.nn.functional.linear(normed, o_w), norm, 1e-5, pdl=on)
            gate, up = torch.nn.functional.linear(normed, gate_up).chunk(2, dim=-1)
            act = silu_mul(gate, up, pdl=on)
            x, normed = add_rms_norm(x, torch.nn.functional.linear(act, down), norm, 1e-5, pdl=on)
        return x

    start = _half(rows, h, scale=1.0)
    want = chain(start, False)
    assert want.isfinite().all() and not torch.equal(want, start)
    _graph_replays_match(chain, start, want)
