"""The decode megakernel's schedule (MEGAKERNEL.md): a step's layers as tasks cut at the fused
kernels' seams, per-SM queues of int descriptors, the counters that order them, and the check
that a schedule can neither deadlock nor read a tile before it is written.

Plain data built on the host for a shape, a row count and an SM count; `validate` runs before a
schedule reaches the GPU. Every task signals one counter once its outputs are stored (in a run
of tiles one block takes together, the last for the run); a wait waits for every signaller of
its counter (the target is their count). Split reductions (ATTN's key splits, OPROJ's heads,
DOWN's K chunks) also arrive on a tile's arrival counter: the last split to arrive sums the
partials in split order and stores the tile."""

import dataclasses
import heapq
from enum import IntEnum

import torch

TILE_ROWS = 16  # weight rows a task streams: mma.m16n8k16's M
ROWS = 8  # activation rows a step holds: mma's N
PAIRS = TILE_ROWS // 2  # QKV: rotation pairs a tile (even rows, then odd); GATEUP: act columns
ATTN_BLOCK = 32  # keys an ATTN task scores at once (a warp's lanes)
NONE = -1  # no counter: a task that waits for nothing, or arrives nowhere
DONE = 0  # counter 0: blocks that finished their queue (the last one advances the epoch)
FIELDS = ("op", "layer", "tile", "split", "wait", "target", "signal", "arrive")  # a descriptor


class Op(IntEnum):
    """The task kinds, in their order within a layer (a topological order of the phases)."""

    QKV = 0  # RMSNorm of x, 8 rotation pairs of the fused QKV weight, RoPE, q / k / v stores
    ATTN = 1  # one key split of one (row, kv head); the last split to arrive combines
    OPROJ = 2  # 16 columns of the output projection over one head's K range; + residual
    GATEUP = 3  # RMSNorm of x_mid, 8 gate and 8 up rows, SiLU-mul into act
    DOWN = 4  # 16 columns of the down projection over one K chunk; + residual


class ScheduleError(ValueError):
    """A schedule that would deadlock or read a tile before it is complete."""


@dataclasses.dataclass(frozen=True)
class MegaShape:
    """The layer stack's sizes (the model config's)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int

    @classmethod
    def from_spec(cls, spec) -> "MegaShape":
        return cls(spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads,
                   spec.head_dim, spec.intermediate_size)  # fmt: skip

    def __post_init__(self) -> None:
        """Tiles never straddle a head (a QKV task signals one kv head) and K ranges are whole
        mma steps."""
        for name, value, unit in (("hidden", self.hidden, TILE_ROWS),
                                  ("head_dim", self.head_dim, TILE_ROWS),
                                  ("inter", self.inter, TILE_ROWS)):  # fmt: skip
            if value % unit:
                raise ValueError(f"megakernel: {name} {value} is not a multiple of {unit}")
        if self.heads % self.kv_heads:
            raise ValueError(f"megakernel: {self.heads} heads over {self.kv_heads} kv heads")

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def down_chunk(self) -> int:
        """DOWN's K range a task: the longest multiple of 16 up to `hidden` that divides inter
        (so a ring slot sized for a hidden-long row holds it)."""
        return max(c for c in range(TILE_ROWS, min(self.hidden, self.inter) + 1, TILE_ROWS)
                   if self.inter % c == 0)  # fmt: skip

    @property
    def max_klen(self) -> int:
        """The longest K range a task streams: a ring slot's row."""
        return max(self.hidden, self.head_dim, self.down_chunk)

    def klen(self, op: Op) -> int:
        """The K range of one task of `op` (0: ATTN streams no weight)."""
        return {Op.QKV: self.hidden, Op.ATTN: 0, Op.OPROJ: self.head_dim,
                Op.GATEUP: self.hidden, Op.DOWN: self.down_chunk}[op]  # fmt: skip

    def weight_bytes(self, op: Op) -> int:
        return TILE_ROWS * self.klen(op) * 2

    def k_start(self, op: Op, split: int) -> int:
        """Where a task's K range starts: OPROJ's at its head, DOWN's at its chunk."""
        return split * {Op.OPROJ: self.head_dim, Op.DOWN: self.down_chunk}.get(op, 0)

    def weight_rows(self, op: Op, tile: int) -> list:
        """The weight rows a task's ring slot holds, in slot order (the kernel's `weight_row`).
        QKV: pair i's even column in row i, its odd one in row i + 8 (the fused weight: q, k,
        v); GATEUP: gate column j in row j, up column j in row j + 8; OPROJ and DOWN: 16 output
        columns. An mma's rows g and g + 8 land in one thread, so RoPE and SiLU-mul need no
        exchange."""
        cols = range(tile * PAIRS, (tile + 1) * PAIRS)
        if op == Op.QKV:
            return [2 * i for i in cols] + [2 * i + 1 for i in cols]
        if op == Op.GATEUP:
            return list(cols) + [self.inter + j for j in cols]
        return [tile * TILE_ROWS + r for r in range(TILE_ROWS)]


@dataclasses.dataclass(frozen=True)
class Task:
    op: Op
    layer: int
    tile: int  # QKV: 8 pairs; ATTN: row * kv_heads + kv head; OPROJ/DOWN: 16 columns; GATEUP: 8
    split: int  # ATTN: key split; OPROJ: head (its K range); DOWN: K chunk; else 0
    wait: int
    target: int
    signal: int
    arrive: int
    order: int  # the global topological index (host only)

    def __str__(self) -> str:
        return f"{self.op.name}(layer {self.layer}, tile {self.tile}, split {self.split})"

    def descriptor(self) -> list:
        return [int(getattr(self, f)) for f in FIELDS]


@dataclasses.dataclass
class Schedule:
    shape: MegaShape
    rows: int
    attn_splits: int
    queues: list  # [blocks] lists of Task, each in increasing `order`
    counters: list  # counter names, by index (0: the blocks done)

    @property
    def blocks(self) -> int:
        return len(self.queues)

    def tasks(self) -> list:
        return sorted((t for q in self.queues for t in q), key=lambda t: t.order)

    def tensors(self) -> tuple:
        """(offsets int32 [blocks + 1], descriptors int32 [tasks, 8]), queue after queue."""
        flat = [t.descriptor() for q in self.queues for t in q]
        offsets = [0]
        for q in self.queues:
            offsets.append(offsets[-1] + len(q))
        return (torch.tensor(offsets, dtype=torch.int32),
                torch.tensor(flat, dtype=torch.int32).view(-1, len(FIELDS)))  # fmt: skip

    def weight_bytes(self) -> list:
        """Weight bytes each block streams a step."""
        return [sum(self.shape.weight_bytes(t.op) for t in q) for q in self.queues]

    def replace(self, block: int, index: int, **changes) -> "Schedule":
        """A copy with one task changed (the tests' planted faults)."""
        queues = [list(q) for q in self.queues]
        queues[block][index] = dataclasses.replace(queues[block][index], **changes)
        return dataclasses.replace(self, queues=queues)


def _layer_tasks(shape: MegaShape, rows: int, attn_splits: int, layer: int, x_prev: int,
                 counter) -> tuple:  # fmt: skip
    """Layer `layer`'s tasks in topological order as (op, tile, split, wait, signal, arrive),
    and the counter its x tiles signal; `x_prev`: the counter x_layer's tiles signal (NONE for
    the step's input); `counter(name)` adds a counter and returns its index."""
    s, d = shape, shape.head_dim
    qkv_done = [counter(f"qkv_done[{layer}][{h}]") for h in range(s.kv_heads)]
    attn_done = [counter(f"attn_done[{layer}][{h}]") for h in range(s.kv_heads)]
    xmid_done = counter(f"xmid_done[{layer}]")
    act_done = [counter(f"act_done[{layer}][{c}]") for c in range(s.inter // s.down_chunk)]
    x_done = counter(f"x_done[{layer}]")
    out = []
    for t in range((s.q_dim + 2 * s.kv_dim) // TILE_ROWS):
        col = t * TILE_ROWS  # q heads, then k heads, then v heads; a tile within one head
        kvh = col // d // s.group if col < s.q_dim else (col - s.q_dim) // d % s.kv_heads
        out.append((Op.QKV, t, 0, x_prev, qkv_done[kvh], NONE))
    for row in range(rows):
        for kvh in range(s.kv_heads):
            arrive = counter(f"attn_arrive[{layer}][{row}][{kvh}]")
            for split in range(attn_splits):
                tile = row * s.kv_heads + kvh
                out.append((Op.ATTN, tile, split, qkv_done[kvh], attn_done[kvh], arrive))
    tiles = range(s.hidden // TILE_ROWS)
    arrive = [counter(f"oproj_arrive[{layer}][{n}]") for n in tiles]
    for h in range(s.heads):  # a head's tiles side by side: a task may take several
        out += [(Op.OPROJ, n, h, attn_done[h // s.group], xmid_done, arrive[n]) for n in tiles]
    for j in range(s.inter // PAIRS):
        out.append((Op.GATEUP, j, 0, xmid_done, act_done[j * PAIRS // s.down_chunk], NONE))
    arrive = [counter(f"down_arrive[{layer}][{n}]") for n in tiles]
    for c in range(s.inter // s.down_chunk):
        out += [(Op.DOWN, n, c, act_done[c], x_done, arrive[n]) for n in tiles]
    return out, x_done


def _runs(tasks: list, tiles_per_task: int) -> list:
    """The layer's tasks in runs of up to `tiles_per_task` consecutive ones of one op that read
    the same inputs and signal the same counter (an ATTN task alone): a run goes to one block,
    its first waits and its last signals, so a block pays one wait and one publication a run."""
    runs: list = []
    for task in tasks:
        op, _, split, wait, signal, _ = task
        head = runs[-1][0] if runs else None  # the current run's first
        same = head is not None and (head[0], *head[2:5]) == (op, split, wait, signal)
        if same and op != Op.ATTN and len(runs[-1]) < tiles_per_task:
            runs[-1].append(task)
        else:
            runs.append([task])
    return runs


def build_schedule(shape: MegaShape, rows: int, blocks: int, attn_splits: int = 2,
                   tiles_per_task: int = 1) -> Schedule:  # fmt: skip
    """A decode step of `rows` rows (1 to ROWS) over `blocks` blocks (one an SM). Tasks go, in
    topological order, each to the block that has streamed the fewest weight bytes this layer
    (then the fewest tasks, then the lowest index): bytes balance within a layer and every
    block works in every phase that has a task a block. Each queue is then in global order, so
    with every block resident the lowest unfinished task can always run. `tiles_per_task`:
    tiles that go together, one after the other, to one block (`_runs`)."""
    if not 1 <= rows <= ROWS:
        raise ValueError(f"megakernel: {rows} rows; a step holds 1 to {ROWS}")
    names = ["done"]

    def counter(name: str) -> int:
        names.append(name)
        return len(names) - 1

    layers, x_prev = [], NONE
    for layer in range(shape.layers):
        tasks, x_prev = _layer_tasks(shape, rows, attn_splits, layer, x_prev, counter)
        layers.append(_runs(tasks, tiles_per_task))
    signallers = [0] * len(names)
    for runs in layers:
        for run in runs:
            signallers[run[-1][4]] += 1
    queues, order = [[] for _ in range(blocks)], 0
    for layer, runs in enumerate(layers):
        heap = [(0, 0, b) for b in range(blocks)]  # (bytes this layer, tasks, block)
        for run in runs:
            load, count, b = heapq.heappop(heap)
            for i, (op, tile, split, wait, signal, arrive) in enumerate(run):
                wait = wait if i == 0 else NONE  # (the run's first waited for their inputs)
                signal = signal if i == len(run) - 1 else NONE
                target = signallers[wait] if wait != NONE else 0
                task = Task(op, layer, tile, split, wait, target, signal, arrive, order)
                queues[b].append(task)
                order += 1
            bytes_ = sum(shape.weight_bytes(task[0]) for task in run)
            heapq.heappush(heap, (load + bytes_, count + len(run), b))
    return Schedule(shape, rows, attn_splits, queues, names)


def validate(schedule: Schedule) -> None:
    """Raises ScheduleError unless: each queue runs in increasing global order; no task is
    listed twice; every wait's target is the count of its counter's signallers (a task reads
    only complete tiles); each arrival counter gathers one tile's splits, one each; and,
    running the tasks in global order, the lowest unfinished task is always at the head of
    its queue with its wait met (so every signaller comes before its waiters, and with every
    block resident nothing deadlocks). A task that waits for nothing (but the first layer's
    QKV, which reads the step's input) or signals nothing must be inside a run (`_runs`): right
    after, or right before, a task of its op, layer and split in its queue, whose wait or
    signal stands for it."""
    n = len(schedule.counters)
    seen, signallers = set(), [[] for _ in range(n)]
    for b, queue in enumerate(schedule.queues):
        for before, task in zip(queue, queue[1:]):
            if task.order <= before.order:
                raise ScheduleError(f"block {b} runs {task} after {before}, out of order")
        for i, task in enumerate(queue):
            before = queue[i - 1] if i else None
            after = queue[i + 1] if i + 1 < len(queue) else None
            first = task.op == Op.QKV and task.layer == 0
            if task.wait == NONE and not first and not _continues(before, task):
                raise ScheduleError(f"{task} waits for nothing and follows no task of its run")
            if task.signal == NONE and not _continues(task, after):
                raise ScheduleError(f"{task} signals nothing and no task of its run follows it")
        for task in queue:
            key = (task.op, task.layer, task.tile, task.split)
            if key in seen:
                raise ScheduleError(f"{task} is scheduled twice")
            seen.add(key)
            for c in (task.wait, task.signal, task.arrive):
                if c != NONE and not 0 < c < n:
                    raise ScheduleError(f"{task} names counter {c}; there are {n}")
            if task.signal != NONE:
                signallers[task.signal].append(task)
    tasks = schedule.tasks()
    for task in tasks:
        if task.wait == NONE:
            continue
        given = len(signallers[task.wait])
        if task.target != given:
            name = schedule.counters[task.wait]
            raise ScheduleError(
                f"{task} waits for {name} to reach {task.target}; {given} tasks signal it"
            )
    _check_arrivals(schedule, tasks)
    _check_progress(schedule, tasks)


def _continues(before, after) -> bool:
    """Whether `after` continues `before`'s run in a queue: the same op, layer and split, the
    one not signalling, the other not waiting."""
    return (
        before is not None
        and after is not None
        and before.signal == NONE == after.wait
        and (before.op, before.layer, before.split) == (after.op, after.layer, after.split)
    )


def _check_arrivals(schedule: Schedule, tasks: list) -> None:
    groups: dict = {}
    for task in tasks:
        if task.arrive != NONE:
            groups.setdefault(task.arrive, []).append(task)
    for c, group in groups.items():
        tiles = {(t.op, t.layer, t.tile) for t in group}
        splits = sorted(t.split for t in group)
        if len(tiles) != 1 or splits != list(range(len(group))):
            raise ScheduleError(f"{schedule.counters[c]} gathers {[str(t) for t in group]}, "
                                "not one tile's splits 0..n-1")  # fmt: skip


def _check_progress(schedule: Schedule, tasks: list) -> None:
    counts = [0] * len(schedule.counters)
    head = [0] * schedule.blocks
    block_of = {id(t): b for b, q in enumerate(schedule.queues) for t in q}
    for task in tasks:
        b = block_of[id(task)]
        at = schedule.queues[b][head[b]]
        if at is not task:
            raise ScheduleError(f"deadlock: {task} is next but block {b} first runs {at}")
        if task.wait != NONE and counts[task.wait] < task.target:
            name = schedule.counters[task.wait]
            raise ScheduleError(f"deadlock: {task} is next but {name} is at "
                                f"{counts[task.wait]} of {task.target}")  # fmt: skip
        if task.signal != NONE:
            counts[task.signal] += 1
        head[b] += 1
