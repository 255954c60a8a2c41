"""The short kernels that ask for the next projection's weight into L2 on the way (`ahead`):
every output as without it, on a GPU (the interpreter cannot run the prefetch: there the
launchers skip it, checked here too)."""

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels.fused_norm import add_rms_norm  # noqa: E402
from variants.kernels.fused_rope import rope_and_cache_write  # noqa: E402
from variants.kernels.fused_silu import silu_mul  # noqa: E402
from variants.kernels.prefetch import ahead_args  # noqa: E402


def _calls(device, dtype=torch.float16, rows=48, hidden=256, heads=4, kv_heads=2, d=32):
    gen = torch.Generator().manual_seed(rows)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(device, dtype)  # noqa: E731
    weight = rand(3 * hidden, hidden)  # the projection after: only its bytes are asked for
    x, delta, norm = rand(rows, hidden), rand(rows, hidden), rand(hidden)
    gate, up = rand(rows, 4 * hidden), rand(rows, 4 * hidden)
    q, k, v = rand(rows, heads, d), rand(rows, kv_heads, d), rand(rows, kv_heads, d)
    cos, sin = rand(64, d // 2), rand(64, d // 2)
    positions = torch.randint(0, 64, (rows,), generator=gen).to(device)
    index = torch.randperm(2 * rows, generator=gen)[:rows].to(device)

    def rope(**ahead):
        pools = [torch.zeros(2 * rows, kv_heads, d, device=device, dtype=dtype) for _ in "kv"]
        out = rope_and_cache_write(q, k, v, cos, sin, *pools, index, positions=positions,
                                   **ahead)  # fmt: skip
        return [out, *pools]

    return weight, {
        "add_rms_norm": lambda **ahead: list(add_rms_norm(x, delta, norm, 1e-5, **ahead)),
        "silu_mul": lambda **ahead: [silu_mul(gate, up, **ahead)],
        "rope_and_cache_write": rope,
    }


@pytest.mark.gpu
@pytest.mark.parametrize("share", [0.25, 1.0])
@pytest.mark.parametrize("kernel", ["add_rms_norm", "silu_mul", "rope_and_cache_write"])
def test_gpu_asking_ahead_changes_no_output(kernel, share):
    weight, calls = _calls("cuda")
    plain, ahead = calls[kernel](), calls[kernel](ahead=weight, ahead_share=share)
    for a, b in zip(plain, ahead):
        assert torch.equal(a, b)


def test_off_the_gpu_and_without_a_weight_nothing_is_asked():
    weight = torch.zeros(64, 32, dtype=torch.float16)
    assert ahead_args(weight, 0.5, weight) == (weight, 0, False)  # a CPU tensor
    assert ahead_args(None, 1.0, weight)[1:] == (0, False)
    assert ahead_args(weight, 0.0, weight)[1:] == (0, False)
    _, calls = _calls("cpu")  # the launchers run with it asked for and skip it
    for call in calls.values():
        assert all(torch.equal(a, b) for a, b in zip(call(), call(ahead=weight)))
