"""The decode megakernel (MEGAKERNEL.md, milestone M1) against the fused layer stack on the
GPU. Per shape (rows x context): one decode step of the slab engine (fused-pdl where the GPU
has PDL) is recorded, and both stacks run on its inputs and weights: each one's logits (the
fused head) against the float32 reference model, and x against each other. Then each stack is
captured in a CUDA graph and replayed back to back, rounds interleaved (CUDA events, medians):
the step's and a layer's GPU time. Then one step profiled (each task's wait for its counter,
for its weights, and its work, by op; each layer's span; the blocks' busy share). Last, a
counter hop's latency between two SMs.

    python experiments/megakernel/bench_megakernel.py [--shapes 8x150,8x40] [--ring-slots 2,4,8]
        [--attn-splits 2,4] [--split-tokens 64,32] [--tiles-per-task 1,4] [--spin-ns 512,64,0]
        [--dtype bfloat16] [--json PATH]

M1's rules (MEGAKERNEL.md section 4): continue at <= 12 us a layer, profile at >= 18,
drop if a hop costs > 1.5 us. Exits 1 when the megakernel's logits are further from the float32
reference than --error-margin times the fused stack's, or when it traps (the watchdog's stuck
task is printed); 2 on a machine it cannot run on."""

import argparse
import functools
import itertools
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from evaluator.reference_model import ReferenceModel  # noqa: E402
from experiments.decode_step_profile import replay_us  # noqa: E402
from experiments.megakernel.megakernel import (  # noqa: E402
    ELEMENT_TYPES,
    SPIN_NS,
    SPLIT_TOKENS,
    Megakernel,
    StepRecorder,
    build,
    step_inputs,
)
from experiments.megakernel.megakernel_schedule import MegaShape, build_schedule, validate  # noqa: E402
from variants.attention.triton_attention import TritonAttention  # noqa: E402
from variants.cache.slab import SlabKVCache  # noqa: E402
from variants.engine import assemble_engine  # noqa: E402
from variants.kernels.device import device_capability, device_sm_count  # noqa: E402
from variants.kernels.pdl import pdl_supported  # noqa: E402
from variants.layers.fused_stack import fused_head, run_fused_stack  # noqa: E402

log = logging.getLogger("bench_megakernel")
CONTINUE_US, PROFILE_US, HOP_DROP_US = 12.0, 18.0, 1.5  # a layer; a hop (MEGAKERNEL.md 4)


def capture(fn) -> torch.cuda.CUDAGraph:
    """`fn` captured in a graph (after a run on a side stream, as torch's examples warm up)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def hop_us(module, hops: int) -> float:
    """One counter hop, signal to seen: two blocks pass a counter back and forth."""
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    module.hop(counter, 1000)
    counter.zero_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    module.hop(counter, hops)
    end.record()
    end.synchronize()
    assert counter.item() == hops, f"the hop kernel counted {counter.item()} of {hops}"
    return start.elapsed_time(end) * 1e3 / hops


def run_checked(mega: Megakernel, inputs) -> torch.Tensor:
    """One step, synchronised; a trap ends the script with the watchdog's stuck task."""
    try:
        out = mega(inputs).clone()
        torch.cuda.synchronize()
    except RuntimeError as e:
        stuck = mega.stuck_task()
        raise SystemExit(f"megakernel failed: {stuck or 'no task stuck'}; {e}") from e
    return out


def bench_shape(engine, recorder, stack, builds: dict, ref, rows: int, ctx: int, args) -> dict:
    """One shape: the step recorded, each stack's error and x, then their graphs timed."""
    spec, device = engine.spec, engine.device
    gen = torch.Generator().manual_seed(rows * 1000 + ctx)
    rids = list(range(rows))
    prompts = [torch.randint(0, spec.vocab_size, (ctx,), generator=gen) for _ in rids]
    tokens = torch.randint(0, spec.vocab_size, (rows,), generator=gen)
    engine.prefill(rids, [p.to(device) for p in prompts])
    engine.decode(rids, tokens.to(device))
    step = recorder.last
    histories = [p.tolist() + [int(t)] for p, t in zip(prompts, tokens)]
    want = torch.stack([ref.forward(torch.tensor(h, device=device)[None])[0, -1].float()
                        for h in histories])  # fmt: skip
    fused = stack(engine, *step, None).clone()
    out = {"rows": rows, "ctx": ctx, "layers": spec.num_layers,
           "fused": {"logits_err": (engine._logits(fused) - want).abs().max().item()}}  # fmt: skip
    graphs = {"fused": capture(lambda: stack(engine, *step, None))}
    megas = {}
    shape = MegaShape.from_spec(spec)
    spins = [int(v) for v in args.spin_ns.split(",")]
    splits = [int(v) for v in args.attn_splits.split(",")]
    least = [int(v) for v in str(args.split_tokens).split(",")]
    inputs = step_inputs(engine, *step)
    runs = [int(v) for v in str(args.tiles_per_task).split(",")]
    for split_count, tiles in itertools.product(splits, runs):
        schedule = build_schedule(shape, rows, device_sm_count(device), split_count, tiles)
        validate(schedule)
        tried = itertools.product(builds.items(), spins, least)
        for (built, (module, ring_slots)), spin, tokens in tried:
            name = built + (f"-splits{split_count}" if len(splits) > 1 else "") + (
                f"-spin{spin}" if len(spins) > 1 else "") + (
                f"-keys{tokens}" if len(least) > 1 else "") + (
                f"-tiles{tiles}" if len(runs) > 1 else "")  # fmt: skip
            knobs = (module, schedule, ring_slots, device, tokens, spin)
            mega = Megakernel(*knobs, dtype=engine.dtype)
            x = run_checked(mega, inputs)
            out[name] = {
                "logits_err": (engine._logits(x) - want).abs().max().item(),
                "x_diff_to_fused": (x.float() - fused.float()).abs().max().item(),
                "ring_slots": ring_slots, "attn_splits": split_count, "spin_ns": spin,
                "split_tokens": tokens, "tiles_per_task": tiles,
                "tasks": len(schedule.tasks()),
            }  # fmt: skip
            graphs[name] = capture(functools.partial(mega, inputs))
            megas[name] = (mega, x)
            # one step profiled (the same kernel, each task's stamps written), after a warm one
            profiled = Megakernel(*knobs, profile=True, dtype=engine.dtype)
            run_checked(profiled, inputs)
            run_checked(profiled, inputs)
            out[name]["profile"] = profiled.profile()
    times: dict = {name: [] for name in graphs}
    for _ in range(args.rounds):
        for name, graph in graphs.items():
            times[name].append(replay_us(graph, args.replays))
    for name, us in times.items():
        out[name]["step_us"] = round(statistics.median(us), 1)
        out[name]["layer_us"] = round(statistics.median(us) / spec.num_layers, 2)
    for name, (mega, x) in megas.items():  # thousands of replays later, on one epoch word
        out[name]["replays_identical"] = torch.equal(mega.buffers["xs"][-1, :rows], x)
        out[name]["stuck"] = mega.stuck_task()
    engine.remove(rids)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--weight-dir", default="target/weights")
    p.add_argument("--shapes", default="8x150,8x40", help="ROWSxCONTEXT, comma-separated")
    p.add_argument("--ring-slots", default="", help="ring depths to build, e.g. 2,4,8 "
                   "(default: the GPU's deepest, up to 8)")  # fmt: skip
    p.add_argument("--consumer-warps", type=int, default=4)
    p.add_argument(
        "--dtype",
        default="config",
        choices=("config", "float16", "bfloat16"),
        help="the engine's and the build's element type (config: the model's)",
    )
    p.add_argument("--attn-splits", default="2", help="key splits, comma-separated to compare")
    p.add_argument(
        "--tiles-per-task",
        default="1",
        help="tiles a block takes together (one wait, one signal), comma-separated to compare",
    )
    p.add_argument(
        "--split-tokens",
        default=str(SPLIT_TOKENS),
        help="a key split's fewest keys, comma-separated to compare",
    )
    p.add_argument(
        "--spin-ns",
        default=str(SPIN_NS),
        help="a waiting lane's longest sleep (ns), comma-separated to compare",
    )
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--replays", type=int, default=100)
    p.add_argument("--hops", type=int, default=20000)
    p.add_argument(
        "--error-margin", type=float, default=1.25,
        help="how many times the fused stack's logits error the megakernel's may be",
    )  # fmt: skip
    p.add_argument("--build-dir", default=None, help="the extension's build folder")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not torch.cuda.is_available():
        print("bench_megakernel: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    major, minor = device_capability(device)
    if major < 8:
        print(
            f"bench_megakernel: compute capability {major}.{minor}; needs >= 8.0", file=sys.stderr
        )
        return 2
    config = json.loads(Path(args.model_config).read_text())
    pdl = pdl_supported(device)
    stack = functools.partial(run_fused_stack, pdl=pdl)
    recorder = StepRecorder(stack)
    engine = assemble_engine(config, args.weight_dir, device, cache_cls=SlabKVCache,
                             attention_cls=TritonAttention, stack=recorder,
                             head=functools.partial(fused_head, pdl=pdl),
                             dtype=args.dtype)  # fmt: skip
    if engine.dtype not in ELEMENT_TYPES:
        print(f"bench_megakernel: no build for {engine.dtype}", file=sys.stderr)
        return 2
    shape = MegaShape.from_spec(engine.spec)
    builds, build_s = {}, {}
    for slots in [int(s) for s in args.ring_slots.split(",") if s] or [None]:
        t0 = time.perf_counter()
        module, ring_slots = build(shape, f"{major}{minor}", args.consumer_warps, slots,
                                   args.build_dir, dtype=engine.dtype)  # fmt: skip
        name = f"mega-ring{ring_slots}"
        builds[name], build_s[name] = (module, ring_slots), round(time.perf_counter() - t0, 1)
        log.info("built %s for sm_%d%d in %.1f s", name, major, minor, build_s[name])
    ref = ReferenceModel(config, args.weight_dir, device, dtype=torch.float32)
    results = {
        "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
        "dtype": str(engine.dtype).removeprefix("torch."),
        "ring_slots": args.ring_slots, "consumer_warps": args.consumer_warps,
        "fused_stack": "fused-pdl" if pdl else "fused", "build_s": build_s,
        "attn_splits": args.attn_splits, "split_tokens": args.split_tokens,
        "tiles_per_task": args.tiles_per_task, "shapes": [],
    }  # fmt: skip
    failed = False
    for rows, ctx in (tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")):
        r = bench_shape(engine, recorder, stack, builds, ref, rows, ctx, args)
        results["shapes"].append(r)
        base = r["fused"]
        log.info("%dx%d: %s %.1f us a step (%.2f a layer), logits error %.2e",
                 rows, ctx, results["fused_stack"], base["step_us"], base["layer_us"],
                 base["logits_err"])  # fmt: skip
        for name in (k for k in r if k.startswith("mega")):
            m = r[name]
            ok = m["logits_err"] <= args.error_margin * base["logits_err"]
            failed |= not ok or not m["replays_identical"] or m["stuck"] is not None
            verdict = ("continue" if m["layer_us"] <= CONTINUE_US else
                       "profile" if m["layer_us"] >= PROFILE_US else "between")  # fmt: skip
            log.info("  %s: %.1f us a step (%.2f a layer: %s), logits error %.2e (%s), x to "
                     "fused %.2e, replays identical %s", name, m["step_us"], m["layer_us"],
                     verdict, m["logits_err"], "ok" if ok else "WORSE", m["x_diff_to_fused"],
                     m["replays_identical"])  # fmt: skip
            prof = m["profile"]
            log.info("    profiled step %.1f us; a layer's span median %.1f us; blocks busy %.2f "
                     "(median) %.2f (most)", prof["step_us"],
                     statistics.median(prof["layer_span_us"]), prof["busy_share"]["median"],
                     prof["busy_share"]["max"])  # fmt: skip
            for op, phases in prof["ops"].items():
                log.info(
                    "    %-6s %5d tasks: wait %.2f, weights %.2f, work %.2f us (medians); "
                    "work %.1f us in all",
                    op,
                    phases["tasks"],
                    phases["wait_us"],
                    phases["weights_us"],
                    phases["work_us"],
                    phases["work_total_us"],
                )
    module = next(iter(builds.values()))[0]
    results["hop_us"] = round(hop_us(module, args.hops), 3)
    log.info("a counter hop: %.3f us (drop above %.1f)", results["hop_us"], HOP_DROP_US)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
