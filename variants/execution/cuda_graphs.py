"""CUDA-graph decode: the whole decode step (all layers and the head) captured per batch bucket.

A launch-bound decode step (hundreds of small kernels) becomes one graph replay. Inputs live in
static buffers filled by one pinned host-to-device copy; a batch pads to the next bucket with
rows that write only the cache's scratch slot; backends that read a gathered context also get
context-length buckets. Captured in create_engine; needs CUDA and a slab or paged cache."""

import torch

from variants.cache.plans import CachePlan


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


def _pinned(t: torch.Tensor) -> torch.Tensor:
    return t.pin_memory() if torch.cuda.is_available() else t


class DecodeGraphs:
    def __init__(self, engine, policy: str, largest_batch: int = 64):
        self.engine, self.cache = engine, engine.cache
        spec, device = engine.spec, engine.device
        self.batches = batch_buckets(policy, largest_batch)
        in_place = getattr(engine.attention, "reads_cache_in_place", False)
        self.contexts = [spec.max_positions] if in_place else context_buckets(spec.max_positions)
        big, width = self.batches[-1], self.cache.table_width(spec.max_positions)
        self.width = width
        # positions, write slots, context lengths, then the [big, width] row table
        self.meta = torch.zeros(big * (3 + width), dtype=torch.long, device=device)
        self.positions = self.meta[:big]
        self.write_index = self.meta[big : 2 * big]
        self.kv_lens = self.meta[2 * big : 3 * big]
        self.table = self.meta[3 * big :].view(big, width)
        self.tokens = torch.zeros(big, dtype=torch.long, device=device)
        self.out = torch.zeros(big, spec.vocab_size, dtype=torch.float32, device=device)
        self.graphs: dict = {}
        self.generation = None

    def capture(self) -> None:
        """Capture every (batch, context) bucket; largest first so the shared pool is sized once."""
        self.graphs.clear()
        self._fill([], [], self.batches[-1], self.contexts[-1])
        pool = torch.cuda.graph_pool_handle()
        stream = capture_stream(self.engine.device)
        stream.wait_stream(torch.cuda.current_stream(self.engine.device))
        with torch.cuda.stream(stream):
            for ctx in reversed(self.contexts):
                for b in reversed(self.batches):
                    self._body(b, ctx)  # warm-up run: kernels chosen, workspaces allocated
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        self._body(b, ctx)
                    self.graphs[b, ctx] = graph
        torch.cuda.current_stream(self.engine.device).wait_stream(stream)
        torch.cuda.synchronize(self.engine.device)
        self.generation = self.cache.generation

    def _body(self, b: int, ctx: int) -> None:
        plan = CachePlan(
            rids=None,
            write_index=self.write_index[:b],
            kv_lens=self.kv_lens[:b],
            max_len=ctx,
            uniform=False,
            rows=self.cache.graph_rows(self.table[:b], ctx),
            table=self.table[:b, : self.cache.table_width(ctx)],
        )
        e = self.engine
        x = e._layers(self.tokens[:b], self.positions[:b], plan, batch=None)
        self.out[:b].copy_(e.output_logits(x, e.weights.norm, e.weights.head))

    def _fill(self, rids: list, positions: list, bucket: int, ctx: int) -> None:
        """Host->device copies of the indices the (bucket, ctx) graph reads: positions, write
        slots and context lengths in one, the row table's used columns in another. Padding rows
        write the cache's scratch slot and attend to one token of it."""
        cache, pad = self.cache, bucket - len(rids)
        scratch = cache.scratch_token()
        write = [cache.token_slots(r, p, p + 1)[0] for r, p in zip(rids, positions)]
        head = (
            positions + [0] * pad + write + [scratch] * pad + [p + 1 for p in positions] + [1] * pad
        )
        big = self.batches[-1]
        staged = _pinned(torch.tensor(head, dtype=torch.long).view(3, bucket))
        self.meta[: 3 * big].view(3, big)[:, :bucket].copy_(staged, non_blocking=True)
        width = cache.table_width(ctx)
        rows = [cache.table_row(r, width) for r in rids] + [cache.table_row(None, width)] * pad
        staged_rows = _pinned(torch.tensor(rows, dtype=torch.long))
        self.table[:bucket, :width].copy_(staged_rows, non_blocking=True)

    def step(self, rids: list, tokens: torch.Tensor, positions: list) -> torch.Tensor:
        b = len(rids)
        longest = max(positions) + 1
        bucket = next((s for s in self.batches if s >= b), None)
        ctx = next((c for c in self.contexts if c >= longest), None)
        if bucket is None or ctx is None:
            return self.engine.eager_decode_step(rids, tokens, positions)
        if self.generation != self.cache.generation:  # the pool moved: old graphs point at it
            self.capture()
        self._fill(rids, positions, bucket, ctx)
        self.tokens[:b].copy_(tokens)
        self.graphs[bucket, ctx].replay()
        return self.out[:b].clone()


def use_cuda_graphs(engine, variant) -> None:
    """Capture decode graphs for the engine and route its decode steps through them."""
    if variant.graphs == "off":
        return
    graphs = DecodeGraphs(engine, variant.graphs)
    graphs.capture()
    engine.decode_step = graphs.step
