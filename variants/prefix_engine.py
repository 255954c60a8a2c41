"""Prefix caching in the engine: a prefill maps each prompt's cached leading blocks into its table
and runs the layers only over the rest, at positions start..n-1, attending over the cached
context too. Wins when requests share a prompt prefix (a system prompt): it is computed once.

Needs the prefix cache (cache/prefix.py), the eager torch layers, no CUDA graphs (registry.py);
decode, remove and the request table are the base engine's."""

import itertools

import torch

from variants.attention.suffix import suffix_attention
from variants.cache.plans import CachePlan
from variants.engine import Engine, assemble_engine, without_grad
from variants.requests import as_id_list, check_token_range


class PrefixCachingEngine(Engine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # prompt tokens prefilled since the engine was made: found cached, and run through it
        self.cached_tokens = 0
        self.computed_tokens = 0

    @without_grad
    def prefill(self, request_ids, input_ids) -> torch.Tensor:
        rids = as_id_list(request_ids)
        prompts, _ = self.checked_prompts(rids, input_ids)
        # The index is keyed by the ids on the host: read them there, and check them before any
        # state changes (the base engine's deferred check would save that read, not this one).
        tokens = torch.cat(prompts)
        check_token_range(tokens, self.spec.vocab_size, f"prefill of {rids}")
        ids = [p.tolist() for p in prompts]
        lengths = [len(t) for t in ids]
        hashes = [self.cache.block_hashes(t) for t in ids]
        self.cache.reserve_prompts(rids, lengths)  # room (or CacheFullError, nothing changed yet)
        starts = []
        for rid, n, h in zip(rids, lengths, hashes):
            if rid in self.lengths:  # re-prefill replaces the old state
                self.cache.release(rid)
                del self.lengths[rid]
            starts.append(self.cache.allocate_prompt(rid, n, h))
            self.lengths[rid] = n
        out = self.suffix_step(rids, starts, lengths, prompts)
        for rid, h in zip(rids, hashes):
            self.cache.publish(rid, h)
        self.cached_tokens += sum(starts)
        self.computed_tokens += sum(lengths) - sum(starts)
        return out

    def suffix_step(self, rids: list, starts: list, lengths: list, prompts: list) -> torch.Tensor:
        """The forward pass over tokens start..n-1 of each prompt once the cache holds its
        blocks: the torch stack's loop, with each request's queries attending over its whole
        context (the cached keys, then the ones this pass writes)."""
        cache, model, index = self.cache, self.model, self.eager.index
        counts = [n - s for s, n in zip(starts, lengths)]
        context = [index(cache.token_slots(r, 0, n)) for r, n in zip(rids, lengths)]
        plan = CachePlan(
            rids,
            write_index=torch.cat([slots[s:] for slots, s in zip(context, starts)]),
            segments=[(r, s, c) for r, s, c in zip(rids, starts, counts)],
        )
        positions = index([p for s, n in zip(starts, lengths) for p in range(s, n)])
        x = model.embed(torch.cat([p[s:] for p, s in zip(prompts, starts)]))
        cos, sin = model.rope.at(positions)
        for layer, w in enumerate(model.weights.layers):
            q, k, v = model.attention_inputs(
                x, w.input_norm, w.qkv, cos, sin, w.qkv_bias, w.q_norm, w.k_norm
            )
            cache.write(layer, plan, k, v)
            o = torch.cat(
                [
                    suffix_attention(q_r, *cache.read_tokens(layer, slots), s)
                    for q_r, slots, s in zip(q.split(counts), context, starts)
                ]
            )
            x = model.attention_outputs(x, o, w.o, w.post_norm, w.gate_up, w.down)
        last = index([end - 1 for end in itertools.accumulate(counts)])
        return model.logits(x.index_select(0, last))


def assemble_prefix_caching_engine(
    model_config, weight_dir, device, **parts
) -> PrefixCachingEngine:
    """assemble_engine's build, load, warm-up and memory budget (`parts`: its arguments); its
    parts (the same weights and prefix cache) then make a PrefixCachingEngine, which changes
    only how a prefill runs (eager: the suffix's ops have nothing to compile, the base's warm-up
    covers the rest)."""
    base = assemble_engine(model_config, weight_dir, device, **parts)
    return PrefixCachingEngine(base.model, base.cache)
