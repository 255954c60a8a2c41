"""PyTorch scaled_dot_product_attention, with PyTorch's choice of backend or pinned to one
(flash, efficient, math, cuDNN: PinnedSdpaAttention).

Flash wins on CUDA for fp16/bf16 prefill (no score matrix in memory); decode with ragged
context needs a mask, which flash lacks, so a pinned decode falls back to efficient, then math.
GQA: grouped query heads ride as extra query rows in decode; prefill expands K/V."""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from variants.attention.padding import from_padded, to_padded


class SdpaAttention:
    reads_cache_in_place = False  # decode reads a gathered copy (cache.read)

    def __init__(self, spec, dtype):
        self.group = spec.num_heads // spec.num_kv_heads

    def prefill(self, q, k, v, batch):
        q, k, v = to_padded(q, batch), to_padded(k, batch), to_padded(v, batch)
        if self.group > 1:
            k, v = (t.repeat_interleave(self.group, dim=1) for t in (k, v))
        return from_padded(F.scaled_dot_product_attention(q, k, v, is_causal=True), batch)

    def decode_from_cache(self, q, cache, layer: int, plan):
        k, v = cache.read(layer, plan)
        return self.decode(q, k, v, plan)

    def decode(self, q, k, v, plan):
        b, kvh, _, d = k.shape
        qg = q.view(b, kvh, self.group, d)
        mask = None  # [B, 1, 1, S]: each row's live keys, where the rows' lengths differ
        if not plan.uniform:
            live = torch.arange(plan.max_len, device=q.device) < plan.kv_lens[:, None]
            mask = live[:, None, None, :]
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
        with sdpa_kernel(self.pinned):
            return super().prefill(q, k, v, batch)

    def decode(self, q, k, v, plan):
        with sdpa_kernel(self.pinned if plan.uniform else self.masked):
            return super().decode(q, k, v, plan)
