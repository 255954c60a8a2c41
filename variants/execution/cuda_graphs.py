"""CUDA-graph decode: the whole decode step (all layers and the head) captured per batch bucket.

A launch-bound decode step (hundreds of small kernels) becomes one graph replay. Inputs live in
static buffers filled by one pinned host-to-device copy; a batch pads to the next bucket with
rows that write only the cache's scratch slot; backends that read a gathered context also get
context-length buckets. Captured in create_engine; needs CUDA and a slab or paged cache."""

import array
import contextlib
import gc

import torch

from variants.cache.plans import CachePlan
from variants.staging import PinnedRing


def batch_buckets(policy: str, largest: int) -> list:
    if policy == "pow2":
        sizes = [1 << i for i in range(largest.bit_length()) if 1 << i <= largest]
    elif policy == "every8":
        sizes = [1, 2, 4] + list(range(8, largest + 1, 8))
    else:
        raise ValueError(f"unknown CUDA-graph bucket policy {policy!r}")
    return sorted(set(min(s, largest) for s in sizes) | {largest})


def context_buckets(max_positions: int, smallest: int = 128) -> list:
    sizes, n = [], smallest
    while n < max_positions:
        sizes.append(n)
        n *= 2
    return sizes + [max_positions]


_CAPTURE_STREAMS: dict = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device for every capture in the process. cuBLAS keeps a workspace
    (32 MiB on Hopper) per stream it has run on and never frees it: a new stream per engine
    leaked that much per engine created (measured on the H200, 20 engines)."""
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return _CAPTURE_STREAMS[device]


@contextlib.contextmanager
def no_collection():
    """Collect dead reference cycles now, and none until the block ends. A dead engine (its
    graphs point back at it) freed during a capture destroys graphs and events mid-capture,
    which invalidates the capture ("operation not permitted when stream is capturing"; seen on
    the H200 when a test built engines back to back). torch.cuda.graph no longer collects
    before a capture in recent PyTorch."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def upload(graph: torch.cuda.CUDAGraph) -> None:
    """Replay a graph once, with its inputs in their padding state (rows that write only the
    scratch slot). A graph's first launch also uploads it to the device: on the H200 that made
    the first replay of each graph cost 0.3-0.6 ms of host time (profiled), paid in every timed
    trace of a fresh engine unless create_engine pays it."""
    graph.replay()


class DecodeGraphs:
    def __init__(self, engine, policy: str, largest_batch: int = 64, check_ids=None):
        """`check_ids`: each graph starts the engine's deferred token check itself (default:
        where the check can be captured, `DeferredRangeCheck.in_graph`)."""
        self.engine, self.cache = engine, engine.cache
        in_graph = engine.token_check.in_graph
        self.check_ids = in_graph if check_ids is None else bool(check_ids) and in_graph
        spec, device = engine.spec, engine.device
        self.batches = batch_buckets(policy, largest_batch)
        # An attention that reads the cache in place serves every context from one graph a
        # batch, unless it asks for context buckets of its own (its launch depends on them).
        if not getattr(engine.attention, "reads_cache_in_place", False):
            self.contexts = context_buckets(spec.max_positions)
        elif hasattr(engine.attention, "graph_contexts"):
            self.contexts = engine.attention.graph_contexts(spec.max_positions, device)
        else:
            self.contexts = [spec.max_positions]
        big, width = self.batches[-1], self.cache.table_width(spec.max_positions)
        self.width = width
        # Per batch bucket b, one buffer: positions [b], write slots [b], context lengths [b],
        # then the [b, width] row table; a call fills it with one pinned copy.
        self.metas = {b: torch.zeros(b * (3 + width), dtype=torch.long, device=device)
                      for b in self.batches}  # fmt: skip
        self.staging = PinnedRing(big * (3 + width), device)
        self.tokens = torch.zeros(big, dtype=torch.long, device=device)
        self.out = torch.zeros(big, spec.vocab_size, dtype=torch.float32, device=device)
        # Each batch size's views of both, made once (a slice is a torch call: ~3 us of host)
        self.row_views = {b: (self.tokens[:b], self.out[:b]) for b in range(1, big + 1)}
        self.graphs: dict = {}
        self.generation = None

    def capture(self) -> None:
        """Capture every (batch, context) bucket; largest first so the shared pool is sized once."""
        self.graphs.clear()
        for b in self.batches:
            self._fill([], [], b)
        pool = torch.cuda.graph_pool_handle()
        stream = capture_stream(self.engine.device)
        stream.wait_stream(torch.cuda.current_stream(self.engine.device))
        with no_collection(), torch.cuda.stream(stream):
            for ctx in reversed(self.contexts):
                for b in reversed(self.batches):
                    self._body(b, ctx)  # warm-up run: kernels chosen, workspaces allocated
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        self._body(b, ctx)
                    self.graphs[b, ctx] = graph
        torch.cuda.current_stream(self.engine.device).wait_stream(stream)
        for graph in self.graphs.values():
            upload(graph)
        torch.cuda.synchronize(self.engine.device)
        self.generation = self.cache.generation

    def _views(self, b: int) -> tuple:
        meta = self.metas[b]
        positions, write, kv_lens = meta[: 3 * b].view(3, b)
        return positions, write, kv_lens, meta[3 * b :].view(b, self.width)

    def _body(self, b: int, ctx: int) -> None:
        positions, write, kv_lens, table = self._views(b)
        plan = CachePlan(
            rids=None,
            write_index=write,
            kv_lens=kv_lens,
            max_len=ctx,
            uniform=False,
            rows=self.cache.graph_rows(table, ctx),
            table=table[:, : self.cache.table_width(ctx)],
        )
        e = self.engine
        tokens = self.tokens[:b]  # the call's ids, copied in unchecked: clamped here (in_vocab)
        # the padding rows are checked too: ids of earlier calls, clamped already
        if self.check_ids:
            x = e.graph_inputs(tokens)
        else:
            x = e.embed(e.in_vocab(tokens, out=tokens))
        x = e._layers(x, positions, plan, batch=None)
        self.out[:b].copy_(e.output_logits(x, e.weights.norm, e.weights.head))

    def _fill(self, rids: list, positions: list, bucket: int) -> None:
        """One pinned host->device copy of all the indices bucket graphs read: positions, write
        slots, context lengths and the full-width row table. Padding rows write the cache's
        scratch slot and attend to one token of it."""
        cache, pad, width = self.cache, bucket - len(rids), self.width
        scratch = cache.scratch_token()
        write = cache.step_slots(rids, positions)
        values = array.array("q", positions + [0] * pad + write + [scratch] * pad)
        values.extend([p + 1 for p in positions] + [1] * pad)
        for r in rids:  # a paged row is an array: extended by a copy, not element by element
            values.extend(cache.table_row(r, width))
        values.extend(cache.table_row(None, width) * pad)
        self.staging.copy(values, self.metas[bucket])

    def step(self, rids: list, tokens: torch.Tensor, positions: list) -> torch.Tensor:
        b = len(rids)
        longest = max(positions) + 1
        bucket = next((s for s in self.batches if s >= b), None)
        ctx = next((c for c in self.contexts if c >= longest), None)
        if bucket is None or ctx is None:
            if self.check_ids:  # the engine left the check to a graph
                self.engine.token_check.start(tokens)
            return self.engine.eager_decode_step(rids, tokens, positions)
        if self.generation != self.cache.generation:  # the pool moved: old graphs point at it
            self.capture()
        self._fill(rids, positions, bucket)
        static_tokens, out = self.row_views[b]
        static_tokens.copy_(tokens)
        self.graphs[bucket, ctx].replay()
        return out.clone()


def use_cuda_graphs(engine, variant) -> None:
    """Capture decode graphs for the engine and route its decode steps through them."""
    if variant.graphs == "off":
        return
    graphs = DecodeGraphs(engine, variant.graphs)
    graphs.capture()
    engine.decode_step = graphs.step
    engine.decode_checks_ids = graphs.check_ids
