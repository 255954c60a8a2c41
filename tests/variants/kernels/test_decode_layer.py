"""One decoder layer as one persistent launch against the fused kernels run one after another
(norm + QKV + RoPE, split-K attention, output projection, norm + SwiGLU, down projection): the
residual stream, the cache writes and the counters left at zero. The interpreter runs a phase a
launch (tests/variants/layers/test_persistent_stack.py); these run the barriers, on the GPU."""

import math
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels.decode_attention import paged_decode_attention  # noqa: E402
from variants.kernels.decode_layer import DecodeLayers, _barrier_counters  # noqa: E402
from variants.kernels.few_row_linear import few_row_linear  # noqa: E402
from variants.kernels.norm_qkv_rope import norm_qkv_rope  # noqa: E402
from variants.kernels.norm_swiglu import norm_swiglu  # noqa: E402
from variants.kernels.split_k import arrival_counters  # noqa: E402
from variants.spec import ModelSpec  # noqa: E402

PUBLIC = dict(hidden_size=768, intermediate_size=3072, num_attention_heads=4,
              num_key_value_heads=4, head_dim=192)  # fmt: skip


def _spec(**dims):
    config = dict(model_type="tiny_llama", vocab_size=256, num_hidden_layers=1,
                  max_position_embeddings=4096, rms_norm_eps=1e-5, torch_dtype="float16",
                  **dims)  # fmt: skip
    return ModelSpec.from_config(config)


def _layer(spec, rows, lens, block_size, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h, i, d = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q_dim, kv_dim = spec.num_heads * d, spec.num_kv_heads * d

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device, dtype)

    w = SimpleNamespace(
        input_norm=1 + rand(h, scale=0.1), qkv=[rand(q_dim + 2 * kv_dim, h, scale=h**-0.5)],
        o=rand(h, q_dim, scale=q_dim**-0.5), post_norm=1 + rand(h, scale=0.1),
        gate_up=[rand(2 * i, h, scale=h**-0.5)], down=rand(h, i, scale=i**-0.5),
    )  # fmt: skip
    width = -(-max(lens) // block_size)
    blocks = torch.randperm(rows * width + 3, generator=gen)[: rows * width]
    table = blocks.view(rows, width).to(device, torch.int32)
    slots = (rows * width + 3) * block_size
    k_pool = rand(slots, spec.num_kv_heads, d)
    v_pool = rand(slots, spec.num_kv_heads, d)
    pos = torch.tensor(lens) - 1
    write = (table.cpu().long()[torch.arange(rows), pos // block_size] * block_size
             + pos % block_size).to(device)  # fmt: skip
    angles = pos[:, None].float() / 10000 ** (torch.arange(0, d, 2).float() / d)
    cos, sin = angles.cos().to(device, dtype), angles.sin().to(device, dtype)
    kv_lens = torch.tensor(lens, device=device, dtype=torch.int32)
    return w, rand(rows, h), cos, sin, write, k_pool, v_pool, table, kv_lens


def _fused(spec, w, x, cos, sin, write, k_pool, v_pool, table, kv_lens, block_size, sms):
    d, eps = spec.head_dim, spec.rms_norm_eps
    q = norm_qkv_rope(x, w.input_norm, w.qkv[0], eps, d, spec.num_heads * d, cos, sin, k_pool,
                      v_pool, write, sm_count=sms)  # fmt: skip
    o = paged_decode_attention(q.view(x.shape[0], -1, d), k_pool, v_pool, table, kv_lens,
                               block_size, 1 / math.sqrt(d), 4).flatten(1)  # fmt: skip
    x = few_row_linear(o, w.o, residual=x, sm_count=sms)
    act = norm_swiglu(x, w.post_norm, w.gate_up[0], eps, sm_count=sms)
    return few_row_linear(act, w.down, residual=x, sm_count=sms)


def _compare(spec, rows, lens, block_size, dtype, device, sms, launches=1):
    w, x, cos, sin, write, k_pool, v_pool, table, kv_lens = _layer(
        spec, rows, lens, block_size, dtype, device
    )
    k_ref, v_ref = k_pool.clone(), v_pool.clone()
    want = _fused(spec, w, x, cos, sin, write, k_ref, v_ref, table, kv_lens, block_size, sms)
    layers = DecodeLayers(spec, rows, max(lens), device, dtype, sms)
    for _ in range(launches):  # the same inputs each time: x is rewritten in place
        got = x.clone()
        layers.run(got, w, cos, sin, write, k_pool, v_pool, table, kv_lens, block_size)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    torch.testing.assert_close(k_pool, k_ref, atol=tol, rtol=tol)
    torch.testing.assert_close(v_pool, v_ref, atol=tol, rtol=tol)
    assert not arrival_counters(torch.device(device)).any()
    assert not _barrier_counters(torch.device(device)).any()
    return layers


def test_phases_match_the_fused_kernels_in_the_interpreter():
    """GQA (4 heads over 2), head_dim 24 (padded to 32), 3 rows of ragged contexts, paged 16."""
    if torch.cuda.is_available():
        pytest.skip("the one-phase-a-launch path is the interpreter's")
    spec = _spec(hidden_size=64, intermediate_size=96, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=24)  # fmt: skip
    layers = _compare(spec, 3, [5, 40, 17], 16, torch.float32, "cpu", 4)
    assert layers.phased


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows,lens", [(1, [150]), (8, [150] * 8), (16, [3, 4000] * 8),
                                       (5, [1, 64, 65, 700, 2047])])  # fmt: skip
def test_gpu_one_launch_matches_the_fused_kernels(rows, lens):
    from variants.kernels.device import device_sm_count

    sms = device_sm_count(torch.device("cuda"))
    layers = _compare(_spec(**PUBLIC), rows, lens, 64, torch.float16, "cuda", sms)
    assert not layers.phased and layers.grid[0] <= sms


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_barriers_reset_over_many_launches():
    """200 launches back to back: each leaves its counters zero for the next (else one hangs)."""
    from variants.kernels.device import device_sm_count

    sms = device_sm_count(torch.device("cuda"))
    _compare(_spec(**PUBLIC), 8, [150] * 8, 64, torch.float16, "cuda", sms, launches=200)
