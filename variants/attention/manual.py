"""Manual attention: float32 scores and softmax, probabilities cast back, then @ V.

The same arithmetic as the reference, so the closest to it; it materialises the full score
matrix, which costs memory and bandwidth on long prompts. Runs anywhere; computes a sliding
window (Mistral) as a mask over the keys the cache keeps."""

import math

import torch

from variants.attention.padding import from_padded, live_keys, to_padded, window_mask


class ManualAttention:
    reads_cache_in_place = False  # decode reads a gathered copy (cache.read)

    def __init__(self, spec, dtype):
        self.group = spec.num_heads // spec.num_kv_heads
        self.scale = 1.0 / math.sqrt(spec.head_dim)
        self.window = spec.sliding_window

    def prefill(self, q, k, v, batch):
        q, k, v = to_padded(q, batch), to_padded(k, batch), to_padded(v, batch)
        if self.group > 1:
            k, v = (t.repeat_interleave(self.group, dim=1) for t in (k, v))
        scores = (q.float() @ k.float().transpose(-1, -2)) * self.scale
        t = scores.shape[-1]
        if self.window is None:
            hidden = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        else:
            hidden = ~window_mask(t, self.window, q.device)
        probs = scores.masked_fill(hidden, float("-inf")).softmax(-1).to(q.dtype)
        return from_padded(probs @ v, batch)

    def decode_from_cache(self, q, cache, layer: int, plan):
        k, v = cache.read(layer, plan)
        return self.decode(q, k, v, plan)

    def decode(self, q, k, v, plan):
        """q [B, heads, d]; k, v [B, kv_heads, S, d]; grouped heads ride as query rows."""
        b, kvh, _, d = k.shape
        qg = q.view(b, kvh, self.group, d)
        scores = (qg.float() @ k.float().transpose(-1, -2)) * self.scale
        if (live := live_keys(plan, self.window, q.device)) is not None:
            scores = scores.masked_fill(~live[:, None, None, :], float("-inf"))
        probs = scores.softmax(-1).to(q.dtype)
        return (probs @ v).reshape(b, -1)
