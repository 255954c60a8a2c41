"""CUDA-graph decode: the whole decode step (all layers and the head) captured per batch bucket.

A launch-bound decode step (hundreds of small kernels) becomes one graph replay. Inputs live in
static buffers filled by one pinned host-to-device copy; a batch pads to the next bucket with
rows that write only the cache's scratch slot; backends that read a gathered context also get
context-length buckets. With the Triton stacks' gathered embedding the graph's first kernel
reads the call's ids where they are and its metadata from pinned memory, as the prefill graphs
do (`gathered_embedding`): the host queues neither a copy nor the ids' copy kernel.
Captured in create_engine; needs CUDA and a slab or paged cache. `GraphRunner` is what this
runner and the prefill graphs' share: the capture, the pool they follow, the ids' check."""

import array
import contextlib
import ctypes
import gc
import weakref

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
    leaked that much per engine created (measured over 20 engines)."""
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return _CAPTURE_STREAMS[device]


# The graphs of runners dropped with their engine, destroyed when the next runner is made. The
# grader drops an engine by assigning the next one over it, just before that one's first timed
# call: destroying ~30 graphs there left the device idle and that call slower
# (experiments/replacement_cost.py). RETIRED_GRAPHS.clear() frees them (and their pool) sooner.
RETIRED_GRAPHS: list = []


def retire(state: dict, tables: tuple) -> None:
    """A dropped runner's graphs (its attributes `state`, the graph tables named `tables`) kept
    for the next runner to destroy."""
    RETIRED_GRAPHS.extend(graph for name in tables for graph in state[name].values())


@contextlib.contextmanager
def no_collection(collect: bool = True):
    """No cyclic collection until the block ends (and, with `collect`, dead cycles collected
    first). A dead object that holds CUDA graphs or events, freed by the collector during a
    capture, destroys them mid-capture, which invalidates it ("operation not permitted when
    stream is capturing"; seen when a test built engines back to back).
    torch.cuda.graph no longer collects before a capture in recent PyTorch. A capture inside
    an engine call (after the cache's pool moved) collects nothing: a collection walks
    every object torch and Triton loaded, which the call would pay."""
    if collect:
        gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class GraphRunner:
    """A runner of CUDA graphs captured per bucket over static buffers of the model's forward
    pass: it owns them, their memory pool and the cache generation they point at. Made from an
    engine's parts (its model, cache, ids' check and eager runner, for calls no graph covers);
    it keeps no reference to the engine."""

    GRAPH_TABLES = ("graphs",)  # its attributes that hold graphs

    def __init__(self, engine, gathered_embedding=None):
        """`gathered_embedding`: the Triton stacks' kernel, where they have one; the graphs then
        read a call's ids where they are, their first kernel gathering, checking and embedding
        them, and its metadata from one pinned buffer."""
        self.model, self.cache, self.eager = engine.model, engine.cache, engine.eager
        self.token_check, self.device = engine.token_check, engine.device
        # the graphs start the engine's deferred check of the ids they run, where this PyTorch
        # can capture it (DeferredRangeCheck.in_graph); else the engine starts it
        self.check_ids = engine.token_check.in_graph
        self.gather = gathered_embedding if self.check_ids else None
        RETIRED_GRAPHS.clear()  # (this engine is being made: outside any timed call)
        self.graphs: dict = {}
        weakref.finalize(self, retire, vars(self), self.GRAPH_TABLES)
        self.pool = None  # one memory pool for the graphs of one cache pool
        self.generation = None  # the cache's generation the graphs point at
        # Graphs that take views of the pool (not through its block table) also follow its
        # layout: a slab's slots may change length in place (`layout`).
        self.follows_layout = not engine.model.attention.reads_cache_in_place
        self.layout = self._layout()

    def _buffers(self, tokens: int, host: int, staged: int) -> None:
        """The graphs' token buffer of `tokens` ids (gathering, only the address the ids'
        sources count from), and the pinned memory a call's metadata goes through: gathering,
        one buffer of `host` int64s that the graphs' first kernel reads; else a ring of
        `staged`, copied in."""
        self.tokens = torch.zeros(tokens, dtype=torch.long, device=self.device)
        self.tokens_at = self.tokens.data_ptr()  # (a tensor call costs host time)
        if self.gather:
            self.host = torch.zeros(host, dtype=torch.long, pin_memory=self.device.type == "cuda")
            self.host_at = self.host.data_ptr()  # (a tensor call costs host time)
        else:
            self.staging = PinnedRing(staged, self.device)

    def _write_host(self, values: array.array, count: int) -> None:
        """The first `count` values into the pinned buffer, once the graph before has read it
        (the check's event follows that read)."""
        self.token_check.wait()
        ctypes.memmove(self.host_at, values.buffer_info()[0], 8 * count)

    def _graph(self, body) -> torch.cuda.CUDAGraph:
        """`body` run once (kernels chosen, workspaces allocated), then captured into the pool
        on the capture stream, with the inputs in their padding state (rows that write only the
        cache's scratch slot). Unlike torch.cuda.graph this does not empty the device and
        pinned-host caches first: a capture inside a call (after the cache's pool moved) would
        then pay for giving memory back and asking for it again (cudaFree, cudaMalloc and
        cudaHostAlloc, which synchronise)."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        stream = capture_stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with no_collection(collect=False), torch.cuda.stream(stream):
            body()
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin(pool=self.pool)
            try:
                body()
            finally:
                graph.capture_end()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        # A graph's first launch also uploads it to the device, which makes the first replay
        # of each graph cost far more host time than later ones, paid in every timed
        # trace of a fresh engine unless create_engine pays it.
        graph.replay()
        torch.cuda.synchronize(self.device)
        return graph

    def _layout(self) -> int:
        return getattr(self.cache, "layout", 0) if self.follows_layout else 0

    def _pool_moved(self) -> bool:
        """Whether the cache's pool moved (or, for graphs that view it, was laid out anew) since
        the graphs were captured; they pointed at the old one and are dropped, captured again
        as calls need them."""
        if self.generation == self.cache.generation and self.layout == self._layout():
            return False
        self.graphs.clear()
        self.generation, self.layout = self.cache.generation, self._layout()
        return True

    def _embedded(self, tokens: torch.Tensor) -> torch.Tensor:
        """The embedding rows of a graph's token buffer, its ids copied in unchecked: their
        check started (where the graph runs it), then clamped in place (`in_vocab`). Padding
        rows hold ids of earlier calls, clamped already."""
        if self.check_ids:
            self.token_check.start(tokens)
        return self.model.embed(tokens, out=tokens)


class DecodeGraphs(GraphRunner):
    """The decode runner of an engine: a graph per (batch, context) bucket."""

    def __init__(self, engine, policy: str, largest_batch: int = 64, gathered_embedding=None):
        super().__init__(engine, gathered_embedding)
        self.batches = batch_buckets(policy, largest_batch)
        self.contexts = self._contexts()
        big, width = self.batches[-1], self.cache.table_width(engine.spec.max_positions)
        self.width = width
        # Per batch bucket b, one buffer: positions [b], write slots [b], context lengths [b],
        # then the [b, width] row table; a call fills it with one pinned copy, or (gathering)
        # writes it into the pinned buffer, followed by the call's row count and each row's
        # source, that the graph's first kernel reads.
        self.metas = {b: torch.zeros(b * (3 + width), dtype=torch.long, device=self.device)
                      for b in self.batches}  # fmt: skip
        self._buffers(big, big * (4 + width) + 1, big * (3 + width))
        # each batch size's view of the token buffer, made once (a slice is a torch call)
        self.token_views = [self.tokens[:b] for b in range(big + 1)]
        # (bucket, context) -> the views [:0], [:1], ... of the logits its graph writes (the
        # head's own output: no copy into a buffer of ours inside the graph)
        self.outputs: dict = {}

    def _contexts(self) -> list:
        """The context buckets. An attention that reads the cache in place serves every context
        from one graph a batch, unless it asks for buckets of its own (its launch depends on
        them); one that reads a gathered context needs a bucket per length it reads, up to
        what the cache holds now."""
        attention = self.model.attention
        if not attention.reads_cache_in_place:
            return doubling_buckets(128, self.cache.max_context)
        return attention.graph_contexts(self.model.spec.max_positions, self.device)

    def capture(self) -> None:
        """Capture every (batch, context) bucket; largest first so the shared pool is sized
        once. After the cache's pool moves, buckets are captured again as calls need them."""
        self.generation, self.layout = self.cache.generation, self._layout()
        with no_collection():
            for ctx in reversed(self.contexts):
                for b in reversed(self.batches):
                    self._capture_one(b, ctx)

    def _capture_one(self, b: int, ctx: int) -> None:
        self._fill([], [], b)  # padding rows (the gathering buffer's layout is the bucket's own)
        self.graphs[b, ctx] = self._graph(lambda: self._body(b, ctx))

    def _body(self, b: int, ctx: int) -> None:
        meta = self.metas[b]
        # Gathering, the first kernel writes the metadata: it comes before any that reads it
        # (a slab's rows, computed from the table for an attention that views the pool).
        if self.gather:  # the call's row count, then the rows' sources, follow the metadata
            size = b * (3 + self.width)
            x = self.gather(
                self.token_check, self.host, meta, self.tokens, b, size, size + 1,
                self.model.spec.vocab_size, self.model.weights.embed,
            )  # fmt: skip
        else:
            x = self._embedded(self.tokens[:b])
        positions, write, kv_lens = meta[: 3 * b].view(3, b)
        table = meta[3 * b :].view(b, self.width)
        plan = CachePlan(
            rids=None,
            write_index=write,
            kv_lens=kv_lens,
            max_len=ctx,
            uniform=False,
            rows=self.cache.graph_rows(table, ctx) if self.follows_layout else None,
            table=table[:, : self.cache.table_width(ctx)],
            staged=not self.gather,
        )
        logits = self.model.logits(self.model.forward(x, positions, self.cache, plan))
        self.outputs[b, ctx] = [logits[:n] for n in range(b + 1)]

    def _fill(self, rids: list, positions: list, bucket: int, source: int = 0) -> None:
        """All the indices bucket graphs read: positions, write slots, context lengths and the
        full-width row table, in one pinned host->device copy; gathering, written into the
        pinned buffer with the call's row count and each row's `source` (its ids' distance
        from the token buffer, in int64s). Padding rows write the cache's scratch slot, attend
        to one token of it and embed id 0."""
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
        self._write_host(values, len(values))

    def decode(self, rids: list, tokens: torch.Tensor, positions: list) -> torch.Tensor:
        if self._pool_moved():
            self.pool = None
            self.contexts = self._contexts()
        b = len(rids)
        bucket = next((s for s in self.batches if s >= b), None)
        ctx = next((c for c in self.contexts if c > max(positions)), None)  # holds position + 1
        if bucket is None or ctx is None:
            if self.check_ids:  # the engine left the check to a graph
                self.token_check.start(tokens)
            return self.eager.decode(rids, tokens, positions)
        if (bucket, ctx) not in self.graphs:
            self._capture_one(bucket, ctx)
        if self.gather:  # the ids read where they are: int64 (check_token_tensor), contiguous
            tokens = tokens if tokens.is_contiguous() else tokens.contiguous()  # held to replay
            self._fill(rids, positions, bucket, (tokens.data_ptr() - self.tokens_at) // 8)
        else:
            self._fill(rids, positions, bucket)
            self.token_views[b].copy_(tokens)
        self.graphs[bucket, ctx].replay()
        return self.outputs[bucket, ctx][b].clone()  # a fresh tensor


def use_cuda_graphs(engine, policy: str, gathered_embedding=None) -> DecodeGraphs:
    """The engine's decode runner: graphs captured at `policy`'s batch buckets (pow2, every8)."""
    runner = DecodeGraphs(engine, policy, gathered_embedding=gathered_embedding)
    runner.capture()
    return runner
