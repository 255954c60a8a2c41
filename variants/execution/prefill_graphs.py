"""CUDA-graph prefill: the layers of a prefill pass captured per token bucket, and the head in
graphs of its own per power-of-two prompt count, on the last token of each of the call's prompts.

An eager prefill of a few hundred tokens is launch-bound like a decode step (many times its
floor at 4 x 128 prompts). Here a call's prompts are packed into
the next power-of-two token bucket; the varlen attention kernel runs on a fixed grid that reads
its (prompt, q-block) pairs from a table, so one graph serves every mix of prompt lengths.
Padding tokens write the cache's scratch slot, belong to no prompt and reach no output row.
Calls beyond the largest bucket or with more prompts than the table holds run eagerly.
With the Triton stacks' gathered embedding (and events a graph can record) the graph reads a
call's prompts where they are and its metadata from pinned memory, in its first kernel
(`gathered_embedding`): the host neither concatenates the prompts nor queues a copy.
Needs CUDA, a slab or paged pool and our Triton attention."""

import array
import functools
import itertools

import torch

from variants.attention.padding import PrefillBatch
from variants.cache.plans import CachePlan
from variants.execution.cuda_graphs import GraphRunner, doubling_buckets, no_collection
from variants.kernels.device import device_capability
from variants.kernels.prefill_attention import prefill_schedule
from variants.kernels.prompt_gather import prompt_sources
from variants.staging import int_fill, int_range

# the token buckets' least and most, and the most prompts a graph runs (more: the eager pass)
SMALLEST_TOKENS, LARGEST_TOKENS, MOST_PROMPTS = 16, 8192, 64


@functools.lru_cache(maxsize=256)
def length_meta(lengths: tuple, t: int, prompts: int, block_m: int, blocks: int) -> tuple:
    """The parts of bucket t's metadata that depend on the prompt lengths alone: the positions
    [t], then the last-token rows [P], prompt starts [P + 1] and q-block table [2, Q] as one
    array. A trace repeats its shapes, so a call usually finds them built (read-only: callers
    copy them)."""
    n, pad = sum(lengths), prompts - len(lengths)
    starts = [0, *itertools.accumulate(lengths)]
    positions = array.array("q")
    for length in lengths:
        positions += int_range(0, length)
    positions += int_fill(0, t - n)
    rest = array.array("q", [s - 1 for s in starts[1:]]) + int_fill(0, pad)
    rest += array.array("q", starts) + int_fill(n, pad)
    rest += prefill_schedule(list(lengths), block_m, blocks)
    return positions, rest


class PrefillGraphs(GraphRunner):
    """The prefill runner of an engine: a graph of the layers per token bucket, and one of the
    head per prompt count."""

    GRAPH_TABLES = ("graphs", "heads")

    def __init__(self, engine, largest_tokens: int = LARGEST_TOKENS,
                 most_prompts: int = MOST_PROMPTS, gathered_embedding=None):  # fmt: skip
        super().__init__(engine, gathered_embedding)
        spec, device = engine.spec, self.device
        self.buckets = doubling_buckets(SMALLEST_TOKENS, largest_tokens)
        self.prompts = most_prompts
        # Each bucket's schedule must be built for the q-block size the kernel launches with on
        # this GPU for that many tokens (the attention's table, else the rules).
        capability, block_m = device_capability(device), engine.model.attention.prefill_block_m
        self.block_m = {t: block_m(t, spec.head_dim, capability) for t in self.buckets}
        # One long buffer; bucket T uses a prefix of it, laid out as positions [T], write
        # slots [T], last-token rows [P], prompt starts [P + 1], q-block table [2, Q(T)].
        size = max(self._meta_size(t) for t in self.buckets)
        self.meta = torch.zeros(size, dtype=torch.long, device=device)
        # The call's packed ids; the metadata staged through pinned buffers and a copy, or
        # (gathering) one pinned buffer the first kernel reads: bucket T's metadata, then its T
        # rows' sources.
        host = max(self._meta_size(t) + (t if self.gather else 0) for t in self.buckets)
        self._buffers(self.buckets[-1], host, size)
        # A call's ints are built here in place, every page touched once now: built by growing
        # an array instead, each call's appends touch fresh pages, slow on some hosts
        # (experiments/bench_host_fill.py).
        self.values, self.values_size = array.array("q", bytes(8 * host)), host
        # The last token's hidden state of each prompt. The head runs in a graph of its own per
        # power-of-two prompt count: inside the layers' graph it would run all P rows (more
        # GPU time a call); launched eagerly it costs more host time than a replay.
        self.hidden = torch.zeros(most_prompts, spec.hidden_size, dtype=engine.dtype, device=device)
        self.head_rows = doubling_buckets(1, most_prompts)
        self.heads: dict = {}
        # prompt count m -> the views [:0], [:1], ... of the logits its head graph writes (the
        # head's own output: no copy into a buffer of ours inside the graph)
        self.head_outputs: dict = {}
        # Views made once (a slice is a torch call, paid in host time)
        self.meta_views = {t: self.meta[: self._meta_size(t)] for t in self.buckets}
        self.place = None  # the buffer a call's unchecked ids were packed into, if any
        self.asked: set = set()  # buckets a call asked for since the pool moved (run eagerly)

    def _blocks(self, tokens: int) -> int:
        """Q(T): the most q-blocks a call of up to T tokens in up to P prompts can have."""
        return -(-tokens // self.block_m[tokens]) + self.prompts

    def _meta_size(self, tokens: int) -> int:
        return 2 * tokens + 2 * self.prompts + 1 + 2 * self._blocks(tokens)

    def _views(self, t: int) -> tuple:
        p, q = self.prompts, self._blocks(t)
        positions, write = self.meta[:t], self.meta[t : 2 * t]
        last = self.meta[2 * t : 2 * t + p]
        starts = self.meta[2 * t + p : 2 * t + 2 * p + 1]
        schedule = self.meta[2 * t + 2 * p + 1 : self._meta_size(t)].view(2, q)
        return positions, write, last, starts, schedule

    def capture(self) -> None:
        """Capture every bucket, largest first so the shared pool is sized once."""
        self.generation, self.layout = self.cache.generation, self._layout()
        with no_collection():
            for t in reversed(self.buckets):
                self._capture_bucket(t)
            for m in self.head_rows:
                self.heads[m] = self._graph(functools.partial(self._head, m))
        # The head at every prompt count once, for the eager path: Triton specializes a kernel
        # on its row count (1, multiples of 16, others), and no timed call may compile one.
        for n in range(1, self.prompts + 1):
            self.model.logits(self.hidden[:n])

    def _capture_bucket(self, t: int) -> None:
        self._fill([], [], t)  # no prompt: scratch writes only
        self.graphs[t] = self._graph(lambda: self._body(t))

    def _body(self, t: int) -> None:
        positions, write, last, starts, schedule = self._views(t)
        plan = CachePlan(rids=None, write_index=write)
        batch = PrefillBatch(
            lengths=None, max_len=t, uniform=False, pad_index=None, last_index=last,
            cu_seqlens=starts, schedule=schedule,
        )  # fmt: skip
        if self.gather:  # the call's token count sits at starts[P] of the metadata
            x = self.gather(
                self.token_check, self.host, self.meta_views[t], self.tokens, t,
                2 * t + 2 * self.prompts, self._meta_size(t), self.model.spec.vocab_size,
                self.model.weights.embed,
            )  # fmt: skip
        else:
            x = self._embedded(self.tokens[:t])
        x = self.model.forward(x, positions, self.cache, plan, batch)
        torch.index_select(x, 0, last, out=self.hidden)

    def _head(self, m: int) -> None:
        """Norm and head on the first m prompt slots (float32, as Model.logits returns)."""
        logits = self.model.logits(self.hidden[:m])
        self.head_outputs[m] = [logits[:r] for r in range(m + 1)]

    def fits(self, tokens: int, prompts: int) -> bool:
        """Whether a graph runs a call of that many tokens and prompts (else the eager pass)."""
        return tokens <= self.buckets[-1] and prompts <= self.prompts

    def stage(self, rids: list, prompts: list, lengths: list, deferred: bool):
        """The call's ids as `prefill` takes them. Unchecked (`deferred`) ids of a call a graph
        runs: its prompts as they are, where the graph reads them in place; else packed
        straight into the graph's token buffer (checked by the graph after this call, or by
        the check started here). Anything else is staged as the eager runner does."""
        self.place = None
        if not (deferred and self.fits(sum(lengths), len(prompts))):
            return self.eager.stage(rids, prompts, lengths, deferred)
        if self.gather:
            return prompts  # the step's graph reads, checks and clamps them in place
        self.place = self.tokens[: sum(lengths)]
        tokens = torch.cat(prompts, out=self.place)
        if not self.check_ids:
            self.token_check.start(tokens)  # the step clamps the ids it runs with
        return tokens

    def abandon(self) -> None:
        """A staged call failed before its graph ran: no unchecked id stays in the buffer."""
        if self.place is not None:
            self.model.in_vocab(self.place, out=self.place)

    def _fill(self, rids: list, lengths: list, t: int, prompts=()) -> None:
        """Everything bucket t's graph reads but the tokens, written as int64s into `values`
        from slices and repeats (C copies: a list of ~1,300 ints and its conversion cost 80-130
        us a call, experiments/bench_host_fill.py; each piece goes into place, none grows an
        array), in one pinned host->device copy; gathering, written into the pinned buffer with
        the rows' sources in `prompts`. All but the write slots depend on the lengths alone:
        built once per shape (`length_meta`)."""
        positions, rest = length_meta(tuple(lengths), t, self.prompts, self.block_m[t],
                                      self._blocks(t))  # fmt: skip
        values, size = self.values, self._meta_size(t)
        values[:t] = positions  # (a slice as long as its new contents: copied in place)
        at = t
        for r, length in zip(rids, lengths):
            values[at : at + length] = self.cache.token_slots(r, 0, length)
            at += length
        values[at : 2 * t] = int_fill(self.cache.scratch_token(), 2 * t - at)
        values[2 * t : size] = rest
        assert len(values) == self.values_size, "a piece of the fill had the wrong length"
        if not self.gather:
            self.staging.copy(values, self.meta_views[t], size)
            return
        at = size
        # the prompts' lengths, unless the call's prompts came packed in one tensor
        counts = lengths if len(prompts) == len(lengths) else None
        for source, count in prompt_sources(prompts, self.tokens_at, counts):
            values[at : at + count] = int_fill(source, count)
            at += count
        assert len(values) == self.values_size, "a prompt's sources had the wrong length"
        self._write_host(values, at)

    def prefill(self, rids: list, lengths: list, tokens) -> torch.Tensor:
        """tokens: the call's packed ids, or (gathering a call that `fits`) its prompts."""
        n = sum(lengths)
        if not self.fits(n, len(rids)):
            return self.eager.prefill(rids, lengths, tokens)
        t = next(b for b in self.buckets if b >= n)
        if self._pool_moved():  # (the head graphs read no cache)
            self.asked.clear()
        if t not in self.graphs and t not in self.asked:
            # The pool moved: the bucket's first call since runs eagerly, its second captures
            # it. A capture runs the bucket twice (to choose kernels, then the upload), which
            # costs more than one eager pass unless the bucket comes back.
            self.asked.add(t)
            return self._eager(rids, lengths, tokens)
        if self.gather:
            prompts = tokens if isinstance(tokens, list) else [tokens]
            prompts = [p if p.is_contiguous() else p.contiguous() for p in prompts]  # held
            if t not in self.graphs:
                self._capture_bucket(t)
            self._fill(rids, lengths, t, prompts)  # after a capture: it fills the buffer too
        else:
            if t not in self.graphs:
                # The capture's runs clamp the token buffer, which may hold this call's
                # unchecked ids (concatenated into place): kept aside for the replay's check.
                held = self.tokens[:n].clone()
                self._capture_bucket(t)
                self.tokens[:n].copy_(held)
            self._fill(rids, lengths, t)
            if tokens.data_ptr() != self.tokens.data_ptr():  # not concatenated into place
                self.tokens[:n].copy_(tokens)
        self.graphs[t].replay()
        rows = len(rids)
        m = next(m for m in self.head_rows if m >= rows)
        self.heads[m].replay()
        return self.head_outputs[m][rows].clone()  # a fresh tensor

    def _eager(self, rids: list, lengths: list, tokens) -> torch.Tensor:
        """The eager pass on ids staged for a graph: their check, which the graph would have
        started, started here."""
        if isinstance(tokens, list):  # gathering: the prompts where they are, unchecked
            tokens = torch.cat(tokens)
            self.token_check.start(tokens)
        elif self.place is not None and self.check_ids:
            self.token_check.start(tokens)
        return self.eager.prefill(rids, lengths, tokens)


def use_prefill_graphs(engine, gathered_embedding=None) -> PrefillGraphs:
    """The engine's prefill runner: graphs captured at every token bucket and prompt count."""
    runner = PrefillGraphs(engine, gathered_embedding=gathered_embedding)
    runner.capture()
    return runner
