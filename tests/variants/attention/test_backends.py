"""Manual and SDPA attention: ragged prefill and ragged decode equal per-request attention, GQA
follows repeat_interleave, and the two backends agree."""

import pytest
import torch

from variants.attention.manual import ManualAttention
from variants.attention.sdpa import PinnedSdpaAttention, SdpaAttention

BACKENDS = {
    "manual": lambda spec: ManualAttention(spec, torch.float32),
    "sdpa-auto": lambda spec: SdpaAttention(spec, torch.float32),
    "sdpa-math": lambda spec: PinnedSdpaAttention(spec, torch.float32, "math"),
}
LENGTHS = [7, 1, 19, 12]


def sharp(shape, gen, scale=3.0):
    """Large scores, so a wrong mask or head mapping changes the result visibly."""
    return torch.randn(*shape, generator=gen) * scale


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("lengths", [LENGTHS, [9, 9]])
def test_prefill_equals_per_request(tiny_spec, prefill_batch, attention_alone, name, lengths):
    gen = torch.Generator().manual_seed(0)
    total = sum(lengths)
    q, k, v = sharp((total, 4, 24), gen), sharp((total, 2, 24), gen), sharp((total, 2, 24), gen)
    out = BACKENDS[name](tiny_spec).prefill(q, k, v, prefill_batch(lengths))
    assert out.shape == (total, 4 * 24)
    start = 0
    for n in lengths:
        s = slice(start, start + n)
        expected = attention_alone(
            q[s].transpose(0, 1), k[s].transpose(0, 1), v[s].transpose(0, 1), True
        )
        assert torch.allclose(out[s], expected, atol=1e-5, rtol=1e-5), n
        start += n


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("kv_lens", [[5, 1, 30, 17], [8, 8, 8]])
def test_decode_equals_per_request(tiny_spec, decode_plan, attention_alone, name, kv_lens):
    gen = torch.Generator().manual_seed(1)
    b, s = len(kv_lens), max(kv_lens)
    q = sharp((b, 4, 24), gen)
    # Garbage past each row's length: the mask must hide it.
    k, v = sharp((b, 2, s, 24), gen, 50.0), sharp((b, 2, s, 24), gen, 50.0)
    out = BACKENDS[name](tiny_spec).decode(q, k, v, decode_plan(kv_lens))
    assert out.shape == (b, 96)
    for i, n in enumerate(kv_lens):
        expected = attention_alone(q[i][:, None], k[i, :, :n], v[i, :, :n], False)
        assert torch.allclose(out[i], expected[0], atol=1e-4, rtol=1e-5), i


@pytest.mark.parametrize("name", BACKENDS)
def test_gqa_query_head_h_reads_kv_head_h_over_group(tiny_spec, decode_plan, name):
    """With 4 heads and 2 kv heads, heads 0,1 read kv head 0 and heads 2,3 kv head 1 (not the
    tiled 0,1,0,1 that `repeat` would give)."""
    s = 6
    q = torch.zeros(1, 4, 24)  # uniform attention: the output is the mean of V over positions
    k = torch.zeros(1, 2, s, 24)
    v = torch.stack([torch.full((s, 24), 1.0), torch.full((s, 24), 10.0)])[None]
    out = BACKENDS[name](tiny_spec).decode(q, k, v, decode_plan([s])).view(4, 24)
    assert torch.allclose(out[:, 0], torch.tensor([1.0, 1.0, 10.0, 10.0]))


@pytest.mark.parametrize("name", BACKENDS)
def test_gqa_prefill_head_mapping(tiny_spec, prefill_batch, name):
    t = 3
    q, k = torch.zeros(t, 4, 24), torch.zeros(t, 2, 24)
    v = torch.stack([torch.full((t, 24), 2.0), torch.full((t, 24), -3.0)], dim=1)
    out = BACKENDS[name](tiny_spec).prefill(q, k, v, prefill_batch([t])).view(t, 4, 24)
    assert torch.allclose(out[:, :, 0], torch.tensor([2.0, 2.0, -3.0, -3.0]).expand(t, 4))


def test_manual_and_sdpa_agree(tiny_spec, prefill_batch, decode_plan):
    gen = torch.Generator().manual_seed(2)
    total = sum(LENGTHS)
    q, k, v = sharp((total, 4, 24), gen), sharp((total, 2, 24), gen), sharp((total, 2, 24), gen)
    batch = prefill_batch(LENGTHS)
    outs = [make(tiny_spec).prefill(q, k, v, batch) for make in BACKENDS.values()]
    kv_lens = [3, 40, 17]
    qd = sharp((3, 4, 24), gen)
    kd, vd = sharp((3, 2, 40, 24), gen), sharp((3, 2, 40, 24), gen)
    decoded = [
        make(tiny_spec).decode(qd, kd, vd, decode_plan(kv_lens)) for make in BACKENDS.values()
    ]
    for other in outs[1:]:
        assert torch.allclose(other, outs[0], atol=1e-5, rtol=1e-5)
    for other in decoded[1:]:
        assert torch.allclose(other, decoded[0], atol=1e-5, rtol=1e-5)


def test_sdpa_backend_lists(tiny_spec):
    from torch.nn.attention import SDPBackend

    flash = PinnedSdpaAttention(tiny_spec, torch.float16, "flash")
    assert flash.pinned == [SDPBackend.FLASH_ATTENTION]
    # Flash takes no mask: ragged decode falls back to efficient, then math.
    assert flash.masked == [
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.MATH,
    ]
