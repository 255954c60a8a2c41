"""The engine core: the request table and the course interface (prefill / decode / remove).

It wires the chosen components: a KV cache layout, an attention backend and an execution mode
that wraps the layer math. Prompts of a call are packed for the projections; only each prompt's
last token goes through the head. Logits come back as a fresh float32 [B, vocab] tensor."""

import contextlib
import functools
import itertools

import torch

from variants.attention.padding import PrefillBatch
from variants.cache.plans import CachePlan
from variants.cache.pool import CacheFullError
from variants.deferred_check import DeferredRangeCheck
from variants.layers.block import make_layer_math
from variants.layers.rope import RopeTable
from variants.requests import (
    as_id_list,
    check_token_range,
    check_token_tensor,
    token_ids_on_host,
)
from variants.spec import ModelSpec, dtype_from_name
from variants.staging import host_tensor
from variants.weights import load_weights


def without_grad(method):
    """The engine call under torch.no_grad(), entered only where grad mode is on: the context
    costs about 2 us of host time a call on this CPU (6-10 on the H200's host), and callers
    that time the engine (the grader) already hold it."""

    @functools.wraps(method)
    def call(*args, **kwargs):
        with torch.no_grad() if torch.is_grad_enabled() else contextlib.nullcontext():
            return method(*args, **kwargs)

    return call


class Engine:
    def __init__(self, spec, weights, device, dtype, cache, attention, stack, wrap=None, head=None):
        """`stack(engine, x, positions, plan, batch)` runs the decoder layers over x, the
        embedded tokens (a fresh tensor, the stack's to update in place), and returns the
        residual stream; `wrap(fn)`, when given, is the execution mode applied to the layer
        math (torch.compile); `head(spec, output_logits)`, when given, replaces the output head
        (falling back to the one it is given where it does not apply)."""
        self.spec, self.weights, self.device, self.dtype = spec, weights, device, dtype
        self.cache, self.attention, self.stack = cache, attention, stack
        self.lengths: dict = {}  # request id -> tokens held in the cache
        self.rope = RopeTable(spec.head_dim, spec.max_positions, spec.rope_theta, device, dtype)
        math = make_layer_math(spec)
        self.attention_inputs, self.attention_outputs, logits = map(wrap, math) if wrap else math
        self.output_logits = logits if head is None else head(spec, logits)
        # Ids on the GPU are range-checked after the call's kernels are queued (a read before
        # them waits for the GPU queue); True checks before any state changes, with that wait.
        self.check_device_tokens = device.type != "cuda"
        self.token_check = DeferredRangeCheck(device, in_graph=True)
        # How a call's forward pass runs: op by op (EagerRunner), or by the CUDA-graph runners
        # (DecodeGraphs, PrefillGraphs) that assemble_engine installs where it has them, which
        # fall back to `eager` for a call they do not cover. Runners hold no reference back to the
        # engine (it is passed to them), so its last reference frees it and its cache without
        # the cyclic collector; its graphs go when the next engine's runners are made.
        self.eager = EagerRunner()
        self.prefill_runner = self.decode_runner = self.eager

    # ----------------------------------------------------------------- the course interface
    @without_grad
    def prefill(self, request_ids, input_ids) -> torch.Tensor:
        rids = as_id_list(request_ids)
        prompts, lengths = self.checked_prompts(rids, input_ids)
        # A re-prefill replaces state that an undo could not bring back: checked first.
        deferred = not self.check_device_tokens and not any(r in self.lengths for r in rids)
        runner = self.prefill_runner
        tokens = runner.stage(self, rids, prompts, lengths, deferred)
        try:
            # room for the call and for the token it returns, which the next decode step
            # writes at position n: a slab grows now, before the prompts are written, not
            # by moving them at that step (or CacheFullError, nothing changed yet)
            most = self.spec.max_positions
            self.cache.reserve(rids, [min(n + 1, most) for n in lengths], self.lengths)
            for rid, n in zip(rids, lengths):  # re-prefill replaces the old state
                if rid in self.lengths:
                    self.cache.release(rid)
                    del self.lengths[rid]
                self.cache.allocate(rid, n)
                self.lengths[rid] = n
            out = runner.prefill(self, rids, lengths, tokens)
        except BaseException:
            runner.abandon(self)
            raise
        vocab = self.spec.vocab_size
        if deferred and (message := self.token_check.error(vocab, f"prefill of {rids}")):
            for rid in rids:  # the new requests' slots hold garbage: give them back
                self.cache.release(rid)
                del self.lengths[rid]
            raise ValueError(message)
        return out

    def checked_prompts(self, rids: list, input_ids) -> tuple:
        """(prompts, their lengths): one 1-D, non-empty prompt within max_position_embeddings
        per request id, on the engine's device, or ValueError naming the first that is not."""
        if not isinstance(input_ids, (list, tuple)):
            input_ids = list(input_ids)
        if len(input_ids) != len(rids):
            raise ValueError(f"{len(rids)} request ids but {len(input_ids)} prompts")
        if not rids:
            raise ValueError("prefill called with no requests")
        prompts, lengths = [], []
        for rid, t in zip(rids, input_ids):
            t = check_token_tensor(t, f"request {rid}", self.device)
            shape = t.shape  # (one tensor call, not dim() and numel(): the host's time is the cost)
            if len(shape) != 1:
                raise ValueError(f"request {rid}: prompt must be 1-D, got shape {list(shape)}")
            n = shape[0]
            if n == 0:
                raise ValueError(f"request {rid}: empty prompt")
            if n > self.spec.max_positions:
                raise ValueError(
                    f"request {rid}: prompt of {n} tokens exceeds "
                    f"max_position_embeddings {self.spec.max_positions}"
                )
            prompts.append(t)
            lengths.append(n)
        return prompts, lengths

    @without_grad
    def decode(self, request_ids, token_ids) -> torch.Tensor:
        rids = as_id_list(request_ids)
        if not rids:
            raise ValueError("decode called with no requests")
        tokens = check_token_tensor(token_ids, "decode", self.device)
        if tokens.dim() != 1 or tokens.numel() != len(rids):
            raise ValueError(
                f"decode: token_ids must be 1-D with one id per request ({len(rids)}), "
                f"got shape {list(tokens.shape)}"
            )
        most = self.spec.max_positions
        for rid in rids:
            if rid not in self.lengths:
                raise KeyError(f"decode: unknown request id {rid} (not prefilled or removed)")
            if self.lengths[rid] + 1 > most:
                raise ValueError(f"request {rid}: decoding past max_position_embeddings {most}")
        vocab, runner = self.spec.vocab_size, self.decode_runner
        deferred = not (self.check_device_tokens or token_ids_on_host(token_ids))
        if not deferred:
            check_token_range(tokens, vocab, "decode")
        elif not runner.check_ids:  # (else the step's graph starts it)
            self.token_check.start(tokens)  # the step clamps the ids it runs with (in_vocab)

        positions = [self.lengths[r] for r in rids]
        self.cache.extend_step(rids, positions, self.lengths)  # room, or CacheFullError
        for rid, p in zip(rids, positions):
            self.lengths[rid] = p + 1
        out = runner.decode(self, rids, tokens, positions)
        if deferred and (message := self.token_check.error(vocab, "decode")) is not None:
            for rid, p in zip(rids, positions):  # the key written at p is past the length again
                self.cache.truncate(rid, p)
                self.lengths[rid] = p
            raise ValueError(message)
        return out

    def remove(self, request_ids) -> None:
        rids = as_id_list(request_ids)
        if unknown := [r for r in rids if r not in self.lengths]:
            raise KeyError(f"remove: unknown request id(s) {unknown}")
        for rid in rids:
            self.cache.release(rid)
            del self.lengths[rid]

    # ----------------------------------------------------------------- the model
    def in_vocab(self, tokens, out=None) -> torch.Tensor:
        """The ids a step runs with, clamped into the vocabulary (into `out`, a graph's static
        buffer, when given: the clamp is then also the copy). Ids on the GPU are range-checked
        after the step is queued (DeferredRangeCheck); a bad one must not reach the embedding
        as an out-of-bounds read or a device-side assert first. In-range ids pass unchanged."""
        return torch.clamp(tokens, 0, self.spec.vocab_size - 1, out=out)

    def _logits(self, x) -> torch.Tensor:
        # a fresh tensor: the head's output is never a reused buffer
        return self.output_logits(x, self.weights.norm, self.weights.head).float()

    def _index(self, values) -> torch.Tensor:
        return host_tensor(values, torch.long, self.device)

    def _prefill_batch(self, lengths) -> PrefillBatch:
        longest = max(lengths)
        starts = list(itertools.accumulate(lengths, initial=0))
        last = self._index([s - 1 for s in starts[1:]])  # each prompt's last token, packed
        batch = PrefillBatch(lengths, longest, min(lengths) == longest, None, last)
        if not batch.uniform:  # the row of each packed token in [batch * longest]
            rows = [b * longest + p for b, n in enumerate(lengths) for p in range(n)]
            batch.pad_index = self._index(rows)
        if self.attention.reads_cache_in_place:
            batch.cu_seqlens = host_tensor(starts, torch.int32, self.device)
        return batch

    # ----------------------------------------------------------------- set-up
    def warm_up(self) -> None:
        """Run every code path once (and compile it) so no timed call pays a first-call cost."""
        ids = [-1, -2, -3]
        gen = torch.Generator().manual_seed(0)
        for lengths in ([3], [5, 2, 7]):
            prompts = [torch.randint(0, self.spec.vocab_size, (n,), generator=gen) for n in lengths]
            self.prefill(ids[: len(lengths)], [p.to(self.device) for p in prompts])
        for batch in ([-1], [-2, -3], [-1, -2, -3]):
            self.decode(batch, torch.zeros(len(batch), dtype=torch.long, device=self.device))
        self.remove([r for r in ids if r in self.lengths])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class EagerRunner:
    """A call's forward pass op by op, with index tensors built for exactly that call: the
    runner of an engine without graphs, and what a graph runner falls back to for a call its
    graphs do not cover. Stateless; each method is handed the engine `e`."""

    check_ids = False  # the engine starts the deferred check of a call's ids (a graph may)

    def stage(self, e, rids: list, prompts: list, lengths: list, deferred: bool):
        """The call's ids packed into one tensor, range-checked now, or (`deferred`) with the
        check started after the call's kernels are queued (the step clamps what it runs)."""
        tokens = torch.cat(prompts)
        if deferred:
            e.token_check.start(tokens)
        else:
            check_token_range(tokens, e.spec.vocab_size, f"prefill of {rids}")
        return tokens

    def abandon(self, e) -> None:
        """A staged call failed before it ran: nothing of it is held here."""

    def prefill(self, e, rids: list, lengths: list, tokens) -> torch.Tensor:
        """The prompts' forward pass once the cache holds their slots: index tensors built for
        exactly this call."""
        slots = [i for r, n in zip(rids, lengths) for i in e.cache.token_slots(r, 0, n)]
        segments = [(r, 0, n) for r, n in zip(rids, lengths)]
        plan = CachePlan(rids, write_index=e._index(slots), segments=segments)
        batch = e._prefill_batch(lengths)
        positions = e._index([p for n in lengths for p in range(n)])
        x = e.stack(e, e.weights.embed[e.in_vocab(tokens)], positions, plan, batch)
        return e._logits(x.index_select(0, batch.last_index))

    def decode(self, e, rids: list, tokens, positions: list) -> torch.Tensor:
        """One decode step with index tensors built for exactly this batch."""
        kv_lens = [p + 1 for p in positions]
        plan = CachePlan(
            rids, write_index=e._index(e.cache.step_slots(rids, positions)),
            kv_lens=e._index(kv_lens), max_len=max(kv_lens), uniform=min(kv_lens) == max(kv_lens),
            rows=e.cache.read_rows(rids), segments=[(r, p, 1) for r, p in zip(rids, positions)],
        )  # fmt: skip
        if e.attention.reads_cache_in_place:
            plan.table = e.attention.block_table(e.cache, rids, plan.max_len, e.device)
        x = e.stack(e, e.weights.embed[e.in_vocab(tokens)], e._index(positions), plan, None)
        return e._logits(x)


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def assemble_engine(
    model_config, weight_dir, device, *, cache_cls, attention_cls, stack, wrap=None, head=None,
    capture=None, capture_prefill=None, dtype="config", fuse_qkv=True, fuse_gate_up=True,
    memory_budget_gib=None,
):  # fmt: skip
    """Build an engine from its chosen components (create_engine passes them).
    `cache_cls(spec, device, dtype, limit_bytes=...)` makes the KV cache (its first size is
    bound to it) and `attention_cls(spec, dtype)` the attention; `stack`, `wrap` and `head` are
    the Engine's;
    `capture(engine)` and `capture_prefill(engine)`, when given, return the decode and prefill
    runners of CUDA graphs, captured after the first warm-up. `dtype`: "config" (the
    reference's rule) or a dtype's name; `fuse_qkv`, `fuse_gate_up`: the projections' weights
    concatenated.
    `memory_budget_gib`: the most the engine may hold (weights, KV cache, graphs and buffers;
    None: what the device has): its cache then grows no further, and a call that needs more
    raises CacheFullError, changing nothing."""
    spec = ModelSpec.from_config(model_config)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = spec.compute_dtype(device) if dtype == "config" else dtype_from_name(dtype)
    before = _allocated(device)
    weights = load_weights(spec, weight_dir, device, dtype, fuse_qkv, fuse_gate_up)
    budget = None if memory_budget_gib is None else int(memory_budget_gib * 2**30)
    limit = None if budget is None else budget - weights.nbytes()
    if limit is not None and limit <= 0:
        raise CacheFullError(
            f"the engine's memory budget of {memory_budget_gib:g} GiB (MEMORY_BUDGET_GIB) does "
            f"not hold its weights ({weights.nbytes() / 2**30:.2f} GiB)"
        )
    cache = cache_cls(spec, device, dtype, limit_bytes=limit)
    attention = attention_cls(spec, dtype)
    engine = Engine(spec, weights, device, dtype, cache, attention, stack, wrap, head)
    engine.warm_up()
    if capture or capture_prefill:  # then every path again, through the graphs
        engine.decode_runner = capture(engine) if capture else engine.eager
        engine.prefill_runner = capture_prefill(engine) if capture_prefill else engine.eager
        engine.warm_up()  # first-replay costs stay out of timed calls
    if budget is not None:  # the rest of the budget, once graphs and buffers are made
        held = _allocated(device) - before if device.type == "cuda" else weights.nbytes()
        cache.limit_bytes = budget - max(held - cache.memory_bytes(), weights.nbytes())
    return engine
