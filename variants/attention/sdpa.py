"""PyTorch scaled_dot_product_attention with a chosen backend (flash, efficient, math, cuDNN).

Flash wins on CUDA for fp16/bf16 prefill (no score matrix in memory); decode with ragged
context needs a mask, which flash lacks, so decode falls back to efficient, then math.
GQA: grouped query heads ride as extra query rows in decode; prefill expands K/V."""

import torch
import torch.nn.functional as F

from variants.attention.padding import from_padded, to_padded

try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # torch < 2.3 is not supported, but keep the import error readable
    SDPBackend = sdpa_kernel = None


def _backends(names: list) -> list:
    table = {
        "flash": "FLASH_ATTENTION",
        "efficient": "EFFICIENT_ATTENTION",
        "math": "MATH",
        "cudnn": "CUDNN_ATTENTION",
    }
    return [getattr(SDPBackend, table[n]) for n in names]


class SdpaAttention:
    reads_cache_in_place = False  # decode reads a gathered copy (cache.read)

    def __init__(self, spec, dtype, variant):
        self.group = spec.num_heads // spec.num_kv_heads
        name = variant.sdpa_backend
        self.prefill_backends = None if name == "auto" else _backends([name])
        fallbacks = [n for n in ("efficient", "math") if n != name]
        self.masked_backends = None if name == "auto" else _backends([name, *fallbacks])

    def _sdpa(self, backends, *args, **kwargs):
        if backends is None:
            return F.scaled_dot_product_attention(*args, **kwargs)
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(*args, **kwargs)

    def prefill(self, q, k, v, batch):
        q, k, v = to_padded(q, batch), to_padded(k, batch), to_padded(v, batch)
        if self.group > 1:
            k = k.repeat_interleave(self.group, dim=1)
            v = v.repeat_interleave(self.group, dim=1)
        return from_padded(self._sdpa(self.prefill_backends, q, k, v, is_causal=True), batch)

    def decode_from_cache(self, q, cache, layer: int, plan):
        k, v = cache.read(layer, plan)
        return self.decode(q, k, v, plan)

    def decode(self, q, k, v, plan):
        b, kvh, _, d = k.shape
        qg = q.view(b, kvh, self.group, d)
        if plan.uniform:
            out = self._sdpa(self.prefill_backends, qg, k, v)
        else:
            live = torch.arange(plan.max_len, device=q.device) < plan.kv_lens[:, None]
            out = self._sdpa(self.masked_backends, qg, k, v, attn_mask=live[:, None, None, :])
        return out.reshape(b, -1)
