"""PyTorch scaled_dot_product_attention, with PyTorch's choice of backend or pinned to one
(flash, efficient, math, cuDNN: PinnedSdpaAttention).

Flash wins on CUDA for fp16/bf16 prefill (no score matrix in memory); decode with ragged
context needs a mask, which flash lacks, so a pinned decode falls back to efficient, then math.
GQA: grouped query heads ride as extra query rows in decode; prefill expands K/V. A sliding
window (Mistral) is a mask over the keys the cache keeps."""

import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from variants.attention.padding import from_padded, live_keys, to_padded, window_mask


class SdpaAttention:
    reads_cache_in_place = False  # decode reads a gathered copy (cache.read)

    def __init__(self, spec, dtype):
        self.group = spec.num_heads // spec.num_kv_heads
        self.window = spec.sliding_window

    def prefill(self, q, k, v, batch):
        q, k, v = to_padded(q, batch), to_padded(k, batch), to_padded(v, batch)
        if self.group > 1:
            k, v = (t.repeat_interleave(self.group, dim=1) for t in (k, v))
        if self.window is None:
            return from_padded(F.scaled_dot_product_attention(q, k, v, is_causal=True), batch)
        mask = window_mask(q.shape[2], self.window, q.device)
        return from_padded(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), batch)

    def decode_from_cache(self, q, cache, layer: int, plan):
        k, v = cache.read(layer, plan)
        return self.decode(q, k, v, plan)

    def decode(self, q, k, v, plan):
        b, kvh, _, d = k.shape
        qg = q.view(b, kvh, self.group, d)
        # [B, 1, 1, S]: each row's live keys, where the rows' lengths differ or a window limits
        live = live_keys(plan, self.window, q.device)
        mask = None if live is None else live[:, None, None, :]
        return F.scaled_dot_product_attention(qg, k, v, attn_mask=mask).reshape(b, -1)


class PinnedSdpaAttention(SdpaAttention):
    """SDPA on one backend (`backend`: flash, efficient, math or cudnn); a masked decode step
    falls back to efficient, then math."""

    def __init__(self, spec, dtype, backend: str):
        super().__init__(spec, dtype)

        def enum(name):  # flash -> SDPBackend.FLASH_ATTENTION, ..., math -> SDPBackend.MATH
            return getattr(SDPBackend, "MATH" if name == "math" else f"{name.upper()}_ATTENTION")

        self.pinned = [enum(backend)]
        self.masked = self.pinned + [enum(n) for n in ("efficient", "math") if n != backend]

    def prefill(self, q, k, v, batch):
        with sdpa_kernel(self.pinned if self.window is None else self.masked):
            return super().prefill(q, k, v, batch)

    def decode(self, q, k, v, plan):
        unmasked = plan.uniform and self.window is None
        with sdpa_kernel(self.pinned if unmasked else self.masked):
            return super().decode(q, k, v, plan)
