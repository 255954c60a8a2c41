"""The engine: the request table, the KV cache and the course interface (prefill / decode /
remove). A call is checked here, makes room in the cache, then goes to a runner, which runs the
model's forward pass (model.py): EagerRunner below, op by op, or CUDA graphs (execution/).
Prompts of a call are packed for the projections; only each prompt's last token goes through
the head. Logits come back as a fresh float32 [B, vocab] tensor."""

import contextlib
import functools
import itertools

import torch

from variants.attention.padding import PrefillBatch
from variants.cache.plans import CachePlan
from variants.cache.pool import CacheFullError
from variants.deferred_check import DeferredRangeCheck
from variants.model import Model
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
    costs host time on every call, and callers that time the engine (the grader) already
    hold it."""

    @functools.wraps(method)
    def call(*args, **kwargs):
        with torch.no_grad() if torch.is_grad_enabled() else contextlib.nullcontext():
            return method(*args, **kwargs)

    return call


class Engine:
    def __init__(self, model, cache):
        self.model, self.cache = model, cache
        self.spec, self.device, self.dtype = model.spec, model.device, model.dtype
        self.lengths: dict = {}  # request id -> tokens held in the cache
        # Ids on the GPU are range-checked after the call's kernels are queued (a read before
        # them waits for the GPU queue); True checks before any state changes, with that wait.
        self.check_device_tokens = self.device.type != "cuda"
        self.token_check = DeferredRangeCheck(self.device, in_graph=True)
        # How a call's forward pass runs: op by op (EagerRunner), or by the CUDA-graph runners
        # (DecodeGraphs, PrefillGraphs) that assemble_engine installs where it has them, which
        # fall back to `eager` for a call they do not cover. Runners hold the model and the
        # cache, never the engine, so its last reference frees it without the cyclic collector.
        self.eager = EagerRunner(model, cache, self.token_check)
        self.prefill_runner = self.decode_runner = self.eager

    # ----------------------------------------------------------------- the course interface
    @without_grad
    def prefill(self, request_ids, input_ids) -> torch.Tensor:
        rids = as_id_list(request_ids)
        prompts, lengths = self.checked_prompts(rids, input_ids)
        # A re-prefill replaces state that an undo could not bring back: checked first.
        deferred = not self.check_device_tokens and not any(r in self.lengths for r in rids)
        runner = self.prefill_runner
        tokens = runner.stage(rids, prompts, lengths, deferred)
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
            out = runner.prefill(rids, lengths, tokens)
        except BaseException:
            runner.abandon()
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
        out = runner.decode(rids, tokens, positions)
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
    graphs do not cover."""

    check_ids = False  # the engine starts the deferred check of a call's ids (a graph may)

    def __init__(self, model, cache, token_check):
        self.model, self.cache, self.token_check = model, cache, token_check
        self.device = model.device

    def stage(self, rids: list, prompts: list, lengths: list, deferred: bool):
        """The call's ids packed into one tensor, range-checked now, or (`deferred`) with the
        check started after the call's kernels are queued (the step clamps what it runs)."""
        tokens = torch.cat(prompts)
        if deferred:
            self.token_check.start(tokens)
        else:
            check_token_range(tokens, self.model.spec.vocab_size, f"prefill of {rids}")
        return tokens

    def abandon(self) -> None:
        """A staged call failed before it ran: nothing of it is held here."""

    def index(self, values) -> torch.Tensor:
        return host_tensor(values, torch.long, self.device)

    def prefill_batch(self, lengths):
        """The call's prompts as the attention takes them (attention/padding.py's PrefillBatch)."""
        longest = max(lengths)
        starts = list(itertools.accumulate(lengths, initial=0))
        last = self.index([s - 1 for s in starts[1:]])  # each prompt's last token, packed
        batch = PrefillBatch(lengths, longest, min(lengths) == longest, None, last)
        if not batch.uniform:  # the row of each packed token in [batch * longest]
            rows = [b * longest + p for b, n in enumerate(lengths) for p in range(n)]
            batch.pad_index = self.index(rows)
        if self.model.attention.reads_cache_in_place:
            batch.cu_seqlens = host_tensor(starts, torch.int32, self.device)
        return batch

    def prefill(self, rids: list, lengths: list, tokens) -> torch.Tensor:
        """The prompts' forward pass once the cache holds their slots."""
        cache, model = self.cache, self.model
        slots = [i for r, n in zip(rids, lengths) for i in cache.token_slots(r, 0, n)]
        segments = [(r, 0, n) for r, n in zip(rids, lengths)]
        plan = CachePlan(rids, write_index=self.index(slots), segments=segments)
        batch = self.prefill_batch(lengths)
        positions = self.index([p for n in lengths for p in range(n)])
        x = model.forward(model.embed(tokens), positions, cache, plan, batch)
        return model.logits(x.index_select(0, batch.last_index))

    def decode(self, rids: list, tokens, positions: list) -> torch.Tensor:
        """One decode step with index tensors built for exactly this batch."""
        cache, model = self.cache, self.model
        kv_lens = [p + 1 for p in positions]
        plan = CachePlan(
            rids, write_index=self.index(cache.step_slots(rids, positions)),
            kv_lens=self.index(kv_lens), max_len=max(kv_lens),
            uniform=min(kv_lens) == max(kv_lens), rows=cache.read_rows(rids),
            segments=[(r, p, 1) for r, p in zip(rids, positions)],
        )  # fmt: skip
        if model.attention.reads_cache_in_place:
            plan.table = model.attention.block_table(cache, rids, plan.max_len, self.device)
        x = model.forward(model.embed(tokens), self.index(positions), cache, plan)
        return model.logits(x)


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
    the Model's;
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
    model = Model(spec, weights, device, dtype, attention_cls(spec, dtype), stack, wrap, head)
    engine = Engine(model, cache)
    engine.warm_up()
    if capture or capture_prefill:  # then every path again, through the graphs
        engine.decode_runner = capture(engine) if capture else engine.eager
        engine.prefill_runner = capture_prefill(engine) if capture_prefill else engine.eager
        engine.warm_up()  # first-replay costs stay out of timed calls
    if budget is not None:  # the rest of the budget, once graphs and buffers are made
        held = _allocated(device) - before if device.type == "cuda" else weights.nbytes()
        cache.limit_bytes = budget - max(held - cache.memory_bytes(), weights.nbytes())
    return engine
