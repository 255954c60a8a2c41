"""FlexAttention (torch.nn.attention.flex_attention): padding-aware causal prefill and ragged
decode as block masks, GQA without copying K/V. Run eagerly it materialises the scores like the
manual backend, so it wins nothing yet; it is the hook for masks SDPA cannot express. Needs
torch >= 2.5; reads the gathered context (cache.read) like SDPA."""

import inspect

import torch

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # torch < 2.5: the registry does not offer flex (probe.has_flex)
    create_block_mask = flex_attention = None

from variants.attention.padding import from_padded, to_padded


class FlexAttention:
    reads_cache_in_place = False  # decode reads a gathered copy (cache.read)

    def __init__(self, spec, dtype):
        self.group = spec.num_heads // spec.num_kv_heads
        gqa = "enable_gqa" in inspect.signature(flex_attention).parameters
        self.expand = self.group > 1 and not gqa  # no enable_gqa: repeat K/V heads instead
        self.gqa = {"enable_gqa": True} if self.group > 1 and gqa else {}
        # Every layer of a call gets the same batch (or plan) object: its mask is built once.
        self.masked = (None, None)

    def _mask(self, call, build):
        if self.masked[0] is not call:
            self.masked = (call, build())
        return self.masked[1]

    def _flex(self, q, k, v, block_mask):
        if self.expand:
            k = k.repeat_interleave(self.group, dim=1)
            v = v.repeat_interleave(self.group, dim=1)
        return flex_attention(q, k, v, block_mask=block_mask, **self.gqa)

    def prefill(self, q, k, v, batch):
        q, k, v = to_padded(q, batch), to_padded(k, batch), to_padded(v, batch)
        rows, t = q.shape[0], q.shape[2]

        def build():
            lengths = torch.tensor(batch.lengths, device=q.device)

            def causal(row, head, q_idx, kv_idx):  # right padding: keys past a prompt stay out
                return (kv_idx <= q_idx) & (kv_idx < lengths[row])

            return create_block_mask(causal, rows, None, t, t, device=q.device)

        return from_padded(self._flex(q, k, v, self._mask(batch, build)), batch)

    def decode_from_cache(self, q, cache, layer: int, plan):
        k, v = cache.read(layer, plan)
        return self.decode(q, k, v, plan)

    def decode(self, q, k, v, plan):
        """q [B, heads, d]; k, v [B, kv_heads, S, d]: one query row over each row's kv_lens."""
        rows, s = k.shape[0], k.shape[2]

        def build():
            def live(row, head, q_idx, kv_idx):
                return kv_idx < plan.kv_lens[row]

            return create_block_mask(live, rows, None, 1, s, device=q.device)

        mask = None if plan.uniform else self._mask(plan, build)
        return self._flex(q[:, :, None], k, v, mask).reshape(rows, -1)
