"""The megakernel's schedule: built for the course shape and small ones, validated, and broken on
purpose; and a CPU simulator that runs the queues in random orders honouring the counters, each
task's math in torch as the CUDA kernel does it (storage in the engine's dtype, float32 sums,
the same casts), against run_fused_stack on the same decode step and the float64 reference."""

import functools
import math
import random

import pytest
import torch

pytest.importorskip("triton")

from evaluator.reference_model import ReferenceModel  # noqa: E402
from variants.cache.paged import PagedKVCache  # noqa: E402
from variants.cache.slab import SlabKVCache  # noqa: E402
from variants.kernels.megakernel import step_inputs  # noqa: E402
from variants.kernels.megakernel_schedule import (  # noqa: E402
    ATTN_BLOCK,
    NONE,
    PAIRS,
    TILE_ROWS,
    MegaShape,
    Op,
    ScheduleError,
    build_schedule,
    validate,
)

COURSE = MegaShape(layers=12, hidden=768, heads=4, kv_heads=4, head_dim=192, inter=3072)
ROWS = 8
SPLITS, SPLIT_TOKENS = 4, 16  # 1 to 4 live splits a row


@pytest.fixture(scope="module")
def tiny_shape():
    return MegaShape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=32, inter=96)


def test_course_schedule_is_valid_and_balanced():
    s = build_schedule(COURSE, rows=8, blocks=132, attn_splits=2)
    validate(s)
    per_layer = {op: 0 for op in Op}
    for t in s.tasks():
        per_layer[t.op] += t.layer == 0
    assert per_layer == {Op.QKV: 144, Op.ATTN: 64, Op.OPROJ: 192, Op.GATEUP: 384, Op.DOWN: 192}
    layer_bytes = 2 * 768 * (3 * 768 + 768 + 2 * 3072 + 3072)  # 18.9 MB: the fused weights
    loads = s.weight_bytes()
    assert sum(loads) == 12 * layer_bytes
    assert max(loads) / min(loads) < 1.2  # 24 KB tiles over ~143 KB a block a layer
    assert all(q[0].op == Op.QKV and q[0].layer == 0 for q in s.queues)


def _broken(schedule, fault: str):
    """`schedule` with one planted fault."""
    b, queue = next((b, q) for b, q in enumerate(schedule.queues) if len(q) > 4)
    if fault == "moved signal":  # a QKV tile signals another kv head's counter
        i = next(i for i, t in enumerate(queue) if t.op == Op.QKV)
        other = next(t.signal for q in schedule.queues for t in q
                     if t.op == Op.QKV and t.layer == queue[i].layer
                     and t.signal != queue[i].signal)  # fmt: skip
        return schedule.replace(b, i, signal=other)
    if fault == "low target":  # a wait that lets its task read a tile before it is complete
        i = next(i for i, t in enumerate(queue) if t.op == Op.GATEUP)
        return schedule.replace(b, i, target=queue[i].target - 1)
    if fault == "out of order":  # a DOWN ahead of the block's first task
        s = schedule.replace(b, 0)
        s.queues[b].insert(0, s.queues[b].pop(next(i for i, t in enumerate(queue)
                                                   if t.op == Op.DOWN)))  # fmt: skip
        return s
    if fault == "deadlock":  # a layer-1 task first, in order, ahead of the layer-0 work it needs
        i = next(i for i, t in enumerate(queue) if t.layer == 1)
        s = schedule.replace(b, i, order=-1)
        s.queues[b].insert(0, s.queues[b].pop(i))
        return s
    if fault == "twice":
        first = queue[0]
        return schedule.replace(b, 1, op=first.op, layer=first.layer, tile=first.tile,
                                split=first.split)  # fmt: skip
    if fault == "loose run":  # a run's second tile (no wait of its own) first on its block
        b, queue = next((b, q) for b, q in enumerate(schedule.queues)
                        if any(t.wait == NONE and t.layer for t in q))  # fmt: skip
        i = next(i for i, t in enumerate(queue) if t.wait == NONE and t.layer)
        s = schedule.replace(b, i, order=-1)
        s.queues[b].insert(0, s.queues[b].pop(i))
        return s
    if fault == "unpublished":  # a lone tile that signals nothing, its waiters' targets cut
        i = next(i for i, t in enumerate(queue) if t.op == Op.GATEUP)
        counter, s = queue[i].signal, schedule.replace(b, i, signal=NONE)
        for c, q in enumerate(s.queues):
            for j, t in enumerate(q):
                if t.wait == counter:
                    s = s.replace(c, j, target=t.target - 1)
        return s
    assert fault == "split lost"  # a DOWN split arrives on another tile's counter
    i = next(i for i, t in enumerate(queue) if t.op == Op.DOWN)
    other = next(t.arrive for t in schedule.tasks() if t.op == Op.DOWN and t.tile != queue[i].tile)
    return schedule.replace(b, i, arrive=other)


FAULTS = {
    "moved signal": "tasks signal it", "low target": "tasks signal it",
    "out of order": "out of order", "deadlock": "deadlock", "twice": "scheduled twice",
    "split lost": "not one tile's splits", "loose run": "follows no task of its run",
    "unpublished": "signals nothing",
}  # fmt: skip


@pytest.mark.parametrize("fault", FAULTS)
def test_validator_catches_planted_faults(fault, tiny_shape):
    tiles = 2 if fault == "loose run" else 1
    schedule = build_schedule(
        tiny_shape, rows=8, blocks=5, attn_splits=SPLITS, tiles_per_task=tiles
    )
    validate(schedule)
    with pytest.raises(ScheduleError, match=FAULTS[fault]):
        validate(_broken(schedule, fault))


class Simulator:
    """A schedule's queues on the CPU: a random block whose next task's wait is met runs that
    task whole, its math in torch as the kernel's (`run`). Every buffer a step writes starts as
    NaN (and the new keys' and values' slots too), so a task that reads a tile before it is
    complete reads NaN, which `read` refuses; `put` refuses a second write of a tile."""

    def __init__(self, schedule, inputs, split_tokens: int):
        s, rows, dt = schedule.shape, schedule.rows, inputs.x.dtype
        self.shape, self.schedule, self.inputs, self.dt = s, schedule, inputs, dt
        self.split_tokens = split_tokens

        def nan(*size, dtype=dt):
            return torch.full(size, float("nan"), dtype=dtype)

        self.x = [inputs.x] + [nan(rows, s.hidden) for _ in range(s.layers)]
        self.xmid = [nan(rows, s.hidden) for _ in range(s.layers)]
        self.q = [nan(rows, s.q_dim) for _ in range(s.layers)]
        self.o = [nan(rows, s.q_dim) for _ in range(s.layers)]
        self.act = [nan(rows, s.inter) for _ in range(s.layers)]
        self.k = [p.clone() for p in inputs.k_pools]
        self.v = [p.clone() for p in inputs.v_pools]
        for pool in self.k + self.v:
            pool[inputs.write_index] = float("nan")
        self.part_o = nan(s.heads, rows, s.hidden, dtype=torch.float32)
        self.part_down = nan(s.inter // s.down_chunk, rows, s.hidden, dtype=torch.float32)
        self.attn_parts: dict = {}
        self.writes: dict = {}  # id(buffer) -> a count an element
        self.counters = [0] * len(schedule.counters)
        self.arrivals = [0] * len(schedule.counters)
        self.task = None

    def read(self, t: torch.Tensor) -> torch.Tensor:
        assert not t.isnan().any(), f"{self.task} read a tile before it was complete"
        return t

    def put(self, buffer: torch.Tensor, index, value: torch.Tensor) -> None:
        count = self.writes.setdefault(id(buffer), (buffer, torch.zeros(buffer.shape)))[1]
        assert (count[index] == 0).all(), f"{self.task} writes a tile a second time"
        count[index] += 1
        buffer[index] = value.to(buffer.dtype)

    def written_once(self) -> bool:
        """Every activation a step writes, and each new key and value, exactly once."""
        wi = self.inputs.write_index
        counts = [self.writes.get(id(b), (b, torch.zeros(b.shape)))[1]
                  for b in self.x[1:] + self.xmid + self.q + self.o + self.act]  # fmt: skip
        counts += [self.writes[id(p)][1][wi] for p in self.k + self.v]
        return all((c == 1).all() for c in counts)

    def step(self, rng: random.Random | None) -> torch.Tensor:
        """Runs every queue to its end, each time a random block of those whose next task's
        wait is met (without `rng`, the one whose next task comes last in the global order:
        every task as early as its wait allows); returns x after the last layer."""
        heads = [0] * self.schedule.blocks
        queues = self.schedule.queues
        while True:
            nexts = [(q[heads[b]], b) for b, q in enumerate(queues) if heads[b] < len(q)]
            ready = [(t, b) for t, b in nexts
                     if t.wait == NONE or self.counters[t.wait] >= t.target]  # fmt: skip
            if not ready:
                assert not nexts, f"deadlock: no block can run {[str(t) for t, _ in nexts[:4]]}"
                return self.x[-1]
            t, b = rng.choice(ready) if rng else max(ready, key=lambda tb: tb[0].order)
            self.run(t)
            heads[b] += 1

    def run(self, t) -> None:
        self.task = t
        if t.op == Op.ATTN:
            self.attend(t)
        else:
            s, w = self.shape, self.inputs.layers[t.layer]
            weight = {Op.QKV: w.qkv[0], Op.OPROJ: w.o, Op.GATEUP: w.gate_up[0],
                      Op.DOWN: w.down}[t.op]  # fmt: skip
            k0 = s.k_start(t.op, t.split)
            tile = weight[s.weight_rows(t.op, t.tile), k0 : k0 + s.klen(t.op)]
            acc = self.activations(t).float() @ tile.float().T  # [rows, 16]: mma's float32
            if t.op == Op.QKV:
                self.rope_store(t, acc[:, :PAIRS].to(self.dt), acc[:, PAIRS:].to(self.dt))
            elif t.op == Op.GATEUP:
                g = acc[:, :PAIRS].to(self.dt).float()
                act = (g / (1 + torch.exp(-g))).to(self.dt).float()
                cols = slice(t.tile * PAIRS, (t.tile + 1) * PAIRS)
                self.put(self.act[t.layer], (slice(None), cols), act * acc[:, PAIRS:].to(self.dt))
            else:
                self.reduce(t, acc)
        if t.signal != NONE:  # (inside a run of tiles, the run's last signals for it)
            self.counters[t.signal] += 1

    def activations(self, t) -> torch.Tensor:
        """h [rows, klen]: x or x_mid RMS-normed (normed, cast, times the weight, cast), or a
        head of o, or a chunk of act."""
        s, w, layer = self.shape, self.inputs.layers[t.layer], t.layer
        if t.op in (Op.QKV, Op.GATEUP):
            x, g = (self.x[layer], w.input_norm) if t.op == Op.QKV else (self.xmid[layer],
                                                                        w.post_norm)  # fmt: skip
            xf = self.read(x).float()
            normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.inputs.eps)
            return (normed.to(self.dt).float() * g.float()).to(self.dt)
        src = self.o[layer] if t.op == Op.OPROJ else self.act[layer]
        k0 = s.k_start(t.op, t.split)
        return self.read(src[:, k0 : k0 + s.klen(t.op)])

    def rope_store(self, t, x0, x1) -> None:
        """RoPE as eager torch rounds it (q, k), or the values as projected (v)."""
        s, inp, layer = self.shape, self.inputs, t.layer
        col = 2 * t.tile * PAIRS  # the tile's first column: q, k or v of one head
        dims = col % s.head_dim + 2 * torch.arange(PAIRS)
        if col >= s.q_dim + s.kv_dim:
            head = (col - s.q_dim - s.kv_dim) // s.head_dim
            for d, v in ((dims, x0), (dims + 1, x1)):
                self.put(self.v[layer], (inp.write_index[:, None], head, d[None, :]), v)
            return
        c = inp.cos[inp.positions][:, dims // 2].float()
        sn = inp.sin[inp.positions][:, dims // 2].float()

        def cast(v):
            return v.to(self.dt).float()

        a, b = cast(x0.float() * c), cast(x1.float() * sn)
        e, f = cast(x0.float() * sn), cast(x1.float() * c)
        r0, r1 = (a - b).to(self.dt), (e + f).to(self.dt)
        if col < s.q_dim:
            cols = col + 2 * torch.arange(PAIRS)
            self.put(self.q[layer], (slice(None), cols), r0)
            self.put(self.q[layer], (slice(None), cols + 1), r1)
        else:
            head = (col - s.q_dim) // s.head_dim
            for d, v in ((dims, r0), (dims + 1, r1)):
                self.put(self.k[layer], (inp.write_index[:, None], head, d[None, :]), v)

    def arrive(self, t, count: int) -> bool:
        self.arrivals[t.arrive] += 1
        return self.arrivals[t.arrive] == count

    def reduce(self, t, acc) -> None:
        """OPROJ / DOWN: the split's partial; the last split sums them in split order, casts,
        adds the residual in float32 and casts once."""
        layer, oproj = t.layer, t.op == Op.OPROJ
        part = self.part_o if oproj else self.part_down
        cols = slice(t.tile * TILE_ROWS, (t.tile + 1) * TILE_ROWS)
        part[t.split, :, cols] = acc
        if not self.arrive(t, part.shape[0]):
            return
        total = self.read(part[0, :, cols])
        for split in range(1, part.shape[0]):
            total = total + self.read(part[split, :, cols])
        res = self.x[layer] if oproj else self.xmid[layer]
        out = self.xmid[layer] if oproj else self.x[layer + 1]
        y = total.to(self.dt).float()
        self.put(out, (slice(None), cols), self.read(res[:, cols]).float() + y)

    def attend(self, t) -> None:
        """One key split as paged_decode_attention's: online softmax in base 2 over tiles of
        ATTN_BLOCK keys, probabilities cast before @ V; the last live split combines."""
        s, inp, layer, dt = self.shape, self.inputs, t.layer, self.dt
        row, kvh = divmod(t.tile, s.kv_heads)
        kv_len, splits = int(inp.kv_lens[row]), self.schedule.attn_splits
        live = min(max(-(-kv_len // self.split_tokens), 1), splits)
        if t.split >= live:
            return
        per_split = -(-kv_len // live)
        split_len = -(-per_split // ATTN_BLOCK) * ATTN_BLOCK
        start, end = t.split * split_len, min((t.split + 1) * split_len, kv_len)
        heads = slice(kvh * s.group * s.head_dim, (kvh + 1) * s.group * s.head_dim)
        q = self.read(self.q[layer][row, heads]).float().view(s.group, s.head_dim)
        m = torch.full((s.group,), -math.inf)
        l_sum, acc = torch.zeros(s.group), torch.zeros(s.group, s.head_dim)
        for n0 in range(start, end, ATTN_BLOCK):
            pos = torch.arange(n0, min(n0 + ATTN_BLOCK, end))
            if inp.block_size == 0:
                slots = inp.table[row, 0].long() + pos
            else:
                slots = inp.table[row, pos // inp.block_size].long() * inp.block_size + (
                    pos % inp.block_size)  # fmt: skip
            k = self.read(self.k[layer][slots, kvh]).float()
            v = self.read(self.v[layer][slots, kvh]).float()
            scores = (q @ k.T) * (inp.scale * math.log2(math.e))
            m_new = torch.maximum(m, scores.max(1).values)
            alpha, p = torch.exp2(m - m_new), torch.exp2(scores - m_new[:, None])
            l_sum = l_sum * alpha + p.sum(1)
            acc = acc * alpha[:, None] + p.to(dt).float() @ v
            m = m_new
        if live == 1:
            o = acc / torch.where(l_sum > 0, l_sum, 1.0)[:, None]
            self.put(self.o[layer], (row, heads), o.flatten())
            return
        self.attn_parts[layer, row, kvh, t.split] = (m, l_sum, acc)
        if not self.arrive(t, live):
            return
        ms, ls, accs = (torch.stack(x) for x in zip(*(
            self.attn_parts[layer, row, kvh, sp] for sp in range(live))))  # fmt: skip
        m_max = ms.max(0).values
        weight = torch.exp2(ms - torch.where(m_max > -math.inf, m_max, 0.0))
        total = (ls * weight).sum(0)
        o = (accs * weight[..., None]).sum(0) / torch.where(total > 0, total, 1.0)[:, None]
        self.put(self.o[layer], (row, heads), o.flatten())


@pytest.fixture(scope="module", params=["float16", "float32"])
def decode_step(request, mega_step):
    """The tiny model's decode step on the CPU in each dtype (slab cache): see `mega_step`."""
    return mega_step("cpu", request.param, SlabKVCache)


def _simulate(engine, step, blocks: int, seed: int | None, schedule=None, tiles: int = 1):
    """(x after the step, the simulator): `schedule` (default: built for `blocks` blocks, in
    runs of `tiles` tiles) in a random order from `seed`, or (None) every task as early as its
    wait allows."""
    inputs = step_inputs(engine, *step)
    shape = MegaShape.from_spec(engine.spec)
    schedule = schedule or build_schedule(shape, ROWS, blocks, SPLITS, tiles)
    sim = Simulator(schedule, inputs, SPLIT_TOKENS)
    return sim.step(None if seed is None else random.Random(seed)), sim


def test_simulated_step_matches_the_fused_stack_and_the_reference(decode_step):
    """Random orders, and tiles in runs of 2 to 4 a task, give the same x, bit for bit (split
    sums in split order); every tile is written once; x is the fused stack's up to float32
    summation order (a few fp16 rounding steps at most), and the logits are no further from the
    float64 reference than the fused stack's."""
    engine, step, fused, history, config, path = decode_step
    outs = []
    for blocks, seed, tiles in ((5, 0, 1), (5, 1, 1), (64, 2, 1), (5, None, 1), (5, 3, 2),
                                (7, 4, 3), (5, None, 4)):  # fmt: skip
        out, sim = _simulate(engine, step, blocks, seed, tiles=tiles)
        assert sim.written_once()
        outs.append(out)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    gap = (outs[0].float() - fused.float()).abs().max().item()
    assert gap < (5e-4 if engine.dtype == torch.float16 else 1e-6), gap  # fp16: ~4 ulps of x
    ref = ReferenceModel(config, path, "cpu", dtype=torch.float64)
    want = torch.stack([ref.forward(torch.tensor(h)[None])[0, -1] for h in history])
    sim_err = (engine._logits(outs[0]).double() - want).abs().max().item()
    fused_err = (engine._logits(fused).double() - want).abs().max().item()
    assert sim_err <= 1.5 * fused_err + 1e-6, (sim_err, fused_err)
    if engine.dtype == torch.float32:
        assert sim_err < 1e-4


def test_simulated_step_reads_a_paged_pool(mega_step):
    """The same step over a paged cache of 16-token blocks: the table's blocks, not a slot's
    first token, find the keys."""
    paged = functools.partial(PagedKVCache, block_size=16)
    engine, step, fused, *_ = mega_step("cpu", "float32", paged)
    assert step[2].table.shape[1] > 1  # block numbers
    out, _ = _simulate(engine, step, blocks=7, seed=5)
    assert (out - fused).abs().max().item() < 1e-6


@pytest.mark.parametrize("fault", ["moved signal", "low target", "deadlock"])
def test_simulator_catches_planted_faults(fault, decode_step):
    """A broken schedule the validator refuses also fails in the simulator, each task run as
    early as its wait allows: a block that can never run, or a task that reads a tile before
    its last writer ran."""
    engine, step, *_ = decode_step
    shape = MegaShape.from_spec(engine.spec)
    schedule = _broken(build_schedule(shape, ROWS, 5, attn_splits=SPLITS), fault)
    with pytest.raises(AssertionError, match="deadlock|before it was complete"):
        _simulate(engine, step, 5, None, schedule)


def test_course_schedule_in_runs_of_tiles(tiny_shape):
    """Tiles in runs of 4 a task: a run's tiles side by side on one block, its first waits and
    its last signals (a layer's publications a quarter of them), the same tiles in all."""
    one = build_schedule(COURSE, rows=8, blocks=132, attn_splits=2)
    runs = build_schedule(COURSE, rows=8, blocks=132, attn_splits=2, tiles_per_task=4)
    validate(runs)
    key = lambda t: (t.op, t.layer, t.tile, t.split)  # noqa: E731
    assert sorted(map(key, one.tasks())) == sorted(map(key, runs.tasks()))
    signals = {op: sum(t.signal != NONE for t in runs.tasks() if t.op == op and t.layer == 0)
               for op in Op}  # fmt: skip
    assert signals == {Op.QKV: 36, Op.ATTN: 64, Op.OPROJ: 48, Op.GATEUP: 96, Op.DOWN: 48}
    for queue in runs.queues:
        for before, task in zip(queue, queue[1:]):
            if task.wait == NONE and task.layer:
                assert (before.op, before.layer, before.split) == (task.op, task.layer, task.split)


def test_every_wait_has_a_signaller(tiny_shape):
    s = build_schedule(tiny_shape, rows=3, blocks=4, attn_splits=2)
    signalled = {t.signal for t in s.tasks()}
    waits = {t.wait for t in s.tasks() if t.wait != NONE}
    assert waits <= signalled and all(t.target > 0 for t in s.tasks() if t.wait != NONE)
