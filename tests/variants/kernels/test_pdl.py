"""Programmatic dependent launch: refused with a reason where it cannot run; on a Hopper GPU each
decode-step kernel launched with it (weights prefetched or not) gives exactly the plain launch's
result, alone and in a CUDA graph of dependent launches, where a missing wait would race."""

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels import pdl  # noqa: E402
from variants.kernels.decode_attention import paged_decode_attention  # noqa: E402
from variants.kernels.few_row_linear import few_row_linear  # noqa: E402
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
def test_gpu_attention_matches_its_plain_launch():
    _hopper()
    batch, heads, d, ctx = 8, 4, 192, 150
    q = _half(batch, heads, d, scale=1.0)
    k_pool, v_pool = _half(batch * ctx, heads, d, scale=1.0), _half(batch * ctx, heads, d)
    table = torch.arange(batch, device="cuda", dtype=torch.int32)[:, None]  # a slab: row b
    lens = torch.randint(1, ctx, (batch,), device="cuda", dtype=torch.int32)
    args = (q, k_pool, v_pool, table, lens, ctx, d**-0.5, 16)
    plain = paged_decode_attention(*args)
    assert torch.equal(paged_decode_attention(*args, pdl=True), plain)


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
