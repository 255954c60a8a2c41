"""Our Triton kernels as an attention backend: varlen prefill on the packed prompts, and split-K
decode that reads the slab or paged pool in place through a block table (no gather copy).

Wins at decode, where gather + SDPA copies every row's context each layer; one graph per batch
bucket suffices (the split ranges come from the lengths on the device). Needs CUDA, Triton
>= 3.0, fp16/bf16, head_dim <= 256 and a slab or paged cache."""

import math

import torch

from variants.kernels.decode_attention import paged_decode_attention
from variants.kernels.decode_attention_rules import choose_num_splits, graph_context_buckets
from variants.kernels.device import device_capability, device_sm_count
from variants.kernels.prefill_attention import prefill_tiles, varlen_prefill_attention
from variants.staging import host_tensor


class TritonAttention:
    reads_cache_in_place = True

    def __init__(self, spec, dtype, knobs: dict | None = None, prefill_knobs: dict | None = None):
        """`knobs`: (rows, context) -> the decode kernel's launch (paged_decode_attention's
        options) at each decode graph bucket, found on this GPU by the autotuner's kernel
        search; its contexts are the graphs' context buckets. Without
        it, or for a call no bucket covers, the rules launch (decode_attention_rules.py).
        `prefill_knobs`: tokens -> the prefill kernel's launch (varlen_prefill_attention's
        `tiles`) at the prefill graph buckets where the search found one faster than the rules
        (the kernel search); a call of another size launches by the rules."""
        self.scale = 1.0 / math.sqrt(spec.head_dim)
        self.kv_heads = spec.num_kv_heads
        self.knobs = knobs or {}
        self.prefill_knobs = prefill_knobs or {}
        # The decode kernel's arrival counters (int32, left at zero by each launch), shared by
        # every layer and graph. A larger batch adds a buffer; none is freed, since captured
        # graphs keep pointing at the one they were captured with.
        self.arrivals: list = []

    def graph_contexts(self, max_positions: int, device) -> list:
        """The context buckets decode graphs are captured at. A graph fixes the decode grid's
        splits for its bucket's longest context, and past LONG_CONTEXT few rows get more of
        them (`choose_num_splits`), which short contexts would pay for. With knobs, their own."""
        if self.knobs:
            return sorted({context for _, context in self.knobs})
        return graph_context_buckets(max_positions, device_capability(torch.device(device)))

    def block_table(self, cache, rids: list, max_len: int, device) -> torch.Tensor:
        """The rows' block tables, as wide as a context of max_len needs (an eager step's)."""
        width = cache.table_width(max_len)
        return host_tensor([cache.table_row(r, width) for r in rids], torch.int32, device)

    def _arrivals(self, batch: int, device) -> torch.Tensor:
        need = batch * self.kv_heads
        for buf in self.arrivals:
            if buf.device == device and buf.numel() >= need:
                return buf
        self.arrivals.append(torch.zeros(max(need, 64), dtype=torch.int32, device=device))
        return self.arrivals[-1]

    def prefill_block_m(self, tokens: int, head_dim: int, capability: tuple) -> int:
        """The q-block rows a prefill of `tokens` packed tokens launches with: a prefill
        graph's schedule is built for them."""
        launch = self.prefill_knobs.get(tokens)
        return launch["tiles"][0] if launch else prefill_tiles(head_dim, capability, tokens)[0]

    def prefill(self, q, k, v, batch):
        out = varlen_prefill_attention(
            q, k, v, batch.cu_seqlens, batch.max_len, self.scale, batch.schedule,
            **self.prefill_knobs.get(q.shape[0], {}),
        )  # fmt: skip
        return out.flatten(1)

    def decode_from_cache(self, q, cache, layer: int, plan, pdl: bool = False):
        """`pdl`: launch with programmatic dependent launch (the fused layers on Hopper)."""
        launch = self.knobs.get((q.shape[0], plan.max_len))
        if launch is None:
            sms, capability = device_sm_count(q.device), device_capability(q.device)
            splits = choose_num_splits(plan.max_len, q.shape[0], self.kv_heads, sms, capability)
            launch = {"num_splits": splits}
        out = paged_decode_attention(
            q, cache.k[layer], cache.v[layer], plan.table, plan.kv_lens,
            cache.kernel_block_size, self.scale, **launch,
            arrivals=self._arrivals(q.shape[0], q.device), pdl=pdl, offsets=cache.table_offsets,
        )  # fmt: skip
        return out.flatten(1)
