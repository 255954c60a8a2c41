"""CUDA-graph decode: the whole decode step (all layers and the head) captured per batch bucket.

A launch-bound decode step (hundreds of small kernels) becomes one graph replay. Inputs live in
static buffers filled by one pinned host-to-device copy; a batch pads to the next bucket with
rows that write only the cache's scratch slot; backends that read a gathered context also get
context-length buckets. With the Triton stacks' gathered embedding the graph's first kernel
reads the call's ids where they are and its metadata from pinned memory, as the prefill graphs
do (kernels/prompt_gather.py): the host queues neither a copy nor the ids' copy kernel.
Captured in create_engine; needs CUDA and a slab or paged cache."""

import array
import contextlib
import ctypes
import gc

import torch

from variants.cache.plans import CachePlan
from variants.staging import PinnedRing, int_fill


def batch_buckets(policy: str, largest: int) -> list:
    if policy == "pow2":
        sizes = [1 << i for i in range(largest.bit_length()) if 1 << i <= largest]
    elif policy == "every8":
        sizes = [1, 2, 4] + list(range(8, largest + 1, 8))
    else:
        raise ValueError(f"unknown CUDA-graph bucket policy {policy!r}")
    return sorted(set(min(s, largest) for s in sizes) | {largest})


def doubling_buckets(smallest: int, largest: int) -> list:
    """smallest, doubled while below largest, then largest: the sizes graphs are captured at
    (the decode graphs' contexts, the prefill graphs' tokens and prompts)."""
    sizes, n = [], smallest
    while n < largest:
        sizes.append(n)
        n *= 2
    return sizes + [largest]


_CAPTURE_STREAMS: dict = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device for every capture in the process. cuBLAS keeps a workspace
    (32 MiB on Hopper) per stream it has run on and never frees it: a new stream per engine
    leaked that much per engine created (measured on the H200, 20 engines)."""
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return _CAPTURE_STREAMS[device]


@contextlib.contextmanager
def no_collection(collect: bool = True):
    """No cyclic collection until the block ends (and, with `collect`, dead cycles collected
    first). A dead object that holds CUDA graphs or events, freed by the collector during a
    capture, destroys them mid-capture, which invalidates it ("operation not permitted when
    stream is capturing"; seen on the H200 when a test built engines back to back).
    torch.cuda.graph no longer collects before a capture in recent PyTorch. A capture inside
    an engine call (after the cache's pool moved) passes collect=False: a collection costs
    100-300 ms with torch and Triton loaded, which the call would pay."""
    if collect:
        gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, pool, stream: torch.cuda.Stream):
    """Capture the block into `graph` on `stream`, sharing memory pool `pool`. Unlike
    torch.cuda.graph this does not empty the device and pinned-host caches first: a capture
    inside a call (after the cache's pool moved) would then pay for giving memory back and
    asking for it again (cudaFree, cudaMalloc and cudaHostAlloc, which synchronise)."""
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=pool)
        try:
            yield
        finally:
            graph.capture_end()


def upload(graph: torch.cuda.CUDAGraph) -> None:
    """Replay a graph once, with its inputs in their padding state (rows that write only the
    scratch slot). A graph's first launch also uploads it to the device: on the H200 that made
    the first replay of each graph cost 0.3-0.6 ms of host time (profiled), paid in every timed
    trace of a fresh engine unless create_engine pays it."""
    graph.replay()


class DecodeGraphs:
    """The decode runner of an engine: it owns the graphs and their static buffers, and is
    handed the engine on each call (it keeps no reference to it)."""

    def __init__(
        self, engine, policy: str, largest_batch: int = 64, check_ids=None,
        checked_embedding=None, gathered_embedding=None,
    ):  # fmt: skip
        """`check_ids`: each graph starts the engine's deferred token check itself (default:
        where the check can be captured, `DeferredRangeCheck.in_graph`). The Triton stacks'
        graphs check, clamp and embed their ids in one kernel, `checked_embedding`
        (kernels/token_check.py), and with `gathered_embedding` (kernels/prompt_gather.py) read
        a call's ids in place."""
        self.cache, self.token_check, self.device = engine.cache, engine.token_check, engine.device
        in_graph = engine.token_check.in_graph
        self.check_ids = in_graph if check_ids is None else bool(check_ids) and in_graph
        # the graphs read the ids in place (their first kernel gathers, checks and embeds)
        self.checked_embedding, self.gathered_embedding = checked_embedding, gathered_embedding
        self.gather = self.check_ids and None not in (checked_embedding, gathered_embedding)
        spec, device = engine.spec, engine.device
        self.batches = batch_buckets(policy, largest_batch)
        self.contexts = self._contexts(engine)
        big, width = self.batches[-1], self.cache.table_width(spec.max_positions)
        self.width = width
        # Per batch bucket b, one buffer: positions [b], write slots [b], context lengths [b],
        # then the [b, width] row table; a call fills it with one pinned copy, or (gathering)
        # writes it into one pinned buffer, followed by the call's row count and each row's
        # source (prompt_gather.py), that the graph's first kernel reads.
        self.metas = {b: torch.zeros(b * (3 + width), dtype=torch.long, device=device)
                      for b in self.batches}  # fmt: skip
        if self.gather:
            cuda = torch.device(device).type == "cuda"
            self.host = torch.zeros(big * (4 + width) + 1, dtype=torch.long, pin_memory=cuda)
            self.host_at = self.host.data_ptr()  # (a tensor call costs the H200's host ~1 us)
        else:
            self.staging = PinnedRing(big * (3 + width), device)
        # The call's ids, copied in; when gathering, only the address their sources count from.
        self.tokens = torch.zeros(big, dtype=torch.long, device=device)
        self.tokens_at = self.tokens.data_ptr()
        # each batch size's view of it, made once (a slice is a torch call: ~3 us of host)
        self.token_views = [self.tokens[:b] for b in range(big + 1)]
        # (bucket, context) -> the views [:0], [:1], ... of the logits its graph writes (the
        # head's own output: no copy into a buffer of ours inside the graph)
        self.outputs: dict = {}
        self.graphs: dict = {}
        self.pool = None
        self.generation = None

    def _contexts(self, engine) -> list:
        """The context buckets. An attention that reads the cache in place serves every context
        from one graph a batch, unless it asks for buckets of its own (its launch depends on
        them); one that reads a gathered context needs a bucket per length it reads, up to
        what the cache holds now."""
        attention, most = engine.attention, engine.spec.max_positions
        if not attention.reads_cache_in_place:
            return doubling_buckets(128, self.cache.max_context)
        return attention.graph_contexts(most, self.device)

    def capture(self, engine) -> None:
        """Capture every (batch, context) bucket; largest first so the shared pool is sized
        once. After the cache's pool moves, buckets are captured again as calls need them."""
        self.graphs.clear()
        self.pool = None
        self.generation = self.cache.generation
        with no_collection():
            for ctx in reversed(self.contexts):
                for b in reversed(self.batches):
                    self._capture_one(engine, b, ctx)
        torch.cuda.synchronize(self.device)

    def _capture_one(self, engine, b: int, ctx: int) -> None:
        if self.pool is None:  # one memory pool for the graphs of one cache pool
            self.pool = torch.cuda.graph_pool_handle()
        stream = capture_stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            # padding rows only (the gathering buffer's layout is the bucket's own)
            self._fill([], [], b)
            self._body(engine, b, ctx)  # warm-up run: kernels chosen, workspaces allocated
            graph = torch.cuda.CUDAGraph()
            with capturing(graph, self.pool, stream):
                self._body(engine, b, ctx)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self._fill([], [], b)
        upload(graph)
        self.graphs[b, ctx] = graph

    def _views(self, b: int) -> tuple:
        meta = self.metas[b]
        positions, write, kv_lens = meta[: 3 * b].view(3, b)
        return positions, write, kv_lens, meta[3 * b :].view(b, self.width)

    def _body(self, e, b: int, ctx: int) -> None:
        positions, write, kv_lens, table = self._views(b)
        plan = CachePlan(
            rids=None,
            write_index=write,
            kv_lens=kv_lens,
            max_len=ctx,
            uniform=False,
            rows=self.cache.graph_rows(table, ctx),
            table=table[:, : self.cache.table_width(ctx)],
            staged=not self.gather,  # gathering, the first kernel writes the metadata
        )
        if self.gather:  # the call's row count, then the rows' sources, follow the metadata
            size = b * (3 + self.width)
            x = self.gathered_embedding(
                e.token_check, self.host, self.metas[b], self.tokens, b, size, size + 1,
                e.spec.vocab_size, e.weights.embed,
            )  # fmt: skip
        else:
            tokens = self.tokens[:b]  # the call's ids, copied in unchecked: clamped (in_vocab)
            # the padding rows are checked too: ids of earlier calls, clamped already
            if self.check_ids:
                x = graph_inputs(e, tokens, self.checked_embedding)
            else:
                x = e.weights.embed[e.in_vocab(tokens, out=tokens)]
        x = e.stack(e, x, positions, plan, None)
        logits = e.output_logits(x, e.weights.norm, e.weights.head).float()
        self.outputs[b, ctx] = [logits[:n] for n in range(b + 1)]

    def _fill(self, rids: list, positions: list, bucket: int, source: int = 0) -> None:
        """All the indices bucket graphs read: positions, write slots, context lengths and the
        full-width row table, in one pinned host->device copy; gathering, written into the
        pinned buffer (once the graph before has read it) with the call's row count and each
        row's `source` (its ids' distance from the token buffer, in int64s). Padding rows write
        the cache's scratch slot, attend to one token of it and embed id 0."""
        cache, pad, width = self.cache, bucket - len(rids), self.width
        scratch = cache.scratch_token()
        write = cache.step_slots(rids, positions)
        values = array.array("q", positions + [0] * pad + write + [scratch] * pad)
        values.extend([p + 1 for p in positions] + [1] * pad)
        for r in rids:  # a paged row is an array: extended by a copy, not element by element
            values.extend(cache.table_row(r, width))
        values.extend(cache.table_row(None, width) * pad)
        if not self.gather:
            self.staging.copy(values, self.metas[bucket])
            return
        values.append(len(rids))
        values.extend(int_fill(source, bucket))
        self.token_check.wait()  # the check follows the last graph's read of the buffer
        ctypes.memmove(self.host_at, values.buffer_info()[0], 8 * len(values))

    def decode(self, engine, rids: list, tokens: torch.Tensor, positions: list) -> torch.Tensor:
        if self.generation != self.cache.generation:  # the pool moved: old graphs point at it
            self.graphs.clear()
            self.pool = None
            self.contexts = self._contexts(engine)
            self.generation = self.cache.generation
        b = len(rids)
        longest = max(positions) + 1
        bucket = next((s for s in self.batches if s >= b), None)
        ctx = next((c for c in self.contexts if c >= longest), None)
        if bucket is None or ctx is None:
            if self.check_ids:  # the engine left the check to a graph
                self.token_check.start(tokens)
            return engine.eager.decode(engine, rids, tokens, positions)
        if (bucket, ctx) not in self.graphs:
            with no_collection(collect=False):
                self._capture_one(engine, bucket, ctx)
        if self.gather:  # the ids read where they are: int64 (check_token_tensor), contiguous
            tokens = tokens if tokens.is_contiguous() else tokens.contiguous()  # held to replay
            self._fill(rids, positions, bucket, (tokens.data_ptr() - self.tokens_at) // 8)
        else:
            self._fill(rids, positions, bucket)
            self.token_views[b].copy_(tokens)
        self.graphs[bucket, ctx].replay()
        return self.outputs[bucket, ctx][b].clone()  # a fresh tensor


def graph_inputs(e, tokens: torch.Tensor, checked_embedding=None) -> torch.Tensor:
    """A graph body's embedded ids (from its static buffer, copied in unchecked): the engine's
    deferred range check started on them, the ids clamped in place (`in_vocab`), then their
    embedding rows (with `checked_embedding`, the three in one kernel)."""
    if checked_embedding is not None:
        return checked_embedding(e.token_check, tokens, e.spec.vocab_size, e.weights.embed)
    e.token_check.start(tokens)
    return e.weights.embed[e.in_vocab(tokens, out=tokens)]


def use_cuda_graphs(engine, policy: str, checked_embedding=None, gathered_embedding=None) -> None:
    """Capture decode graphs at `policy`'s batch buckets (pow2, every8) for the engine and
    route its decode steps through them."""
    runner = DecodeGraphs(
        engine, policy, checked_embedding=checked_embedding, gathered_embedding=gathered_embedding
    )
    runner.capture(engine)
    engine.run_with(decode=runner)
