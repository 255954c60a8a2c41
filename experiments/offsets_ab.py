"""The slab's decode attention: a row found from its first token slot (`offsets`, this tree)
against its block number with block_size = the slot length (the layout before it), at a wide
decode's shape, with and without PDL (and its L2 prefetch), each timed as 20 launches in one
CUDA graph, medians of 15 replays. The outputs must be equal.

    python experiments/offsets_ab.py [--rows 64] [--slot 512] [--lens 260,380]
"""

import argparse
import functools
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from variants.kernels.decode_attention import paged_decode_attention  # noqa: E402
from variants.kernels.decode_attention_rules import choose_num_splits  # noqa: E402
from variants.kernels.device import device_capability, device_sm_count  # noqa: E402


def graph_us(launch, copies: int = 20, replays: int = 15) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch()
        launch()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(copies):
            launch()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(1e3 * start.elapsed_time(end) / copies)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--slot", type=int, default=512)
    p.add_argument("--lens", default="260,380")
    p.add_argument("--contexts", default="1024,4096", help="graph buckets: the grid's splits")
    args = p.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows, kvh, d, slot = args.rows, 4, 192, args.slot
    sms, capability = device_sm_count(dev), device_capability(dev)
    k = torch.randn((rows + 1) * slot, kvh, d, device=dev, dtype=torch.float16)
    v = torch.randn_like(k)
    q = torch.randn(rows, kvh, d, device=dev, dtype=torch.float16)
    slots = torch.arange(rows, dtype=torch.int32, device=dev)[:, None]
    arrivals = torch.zeros(rows * kvh + 64, dtype=torch.int32, device=dev)
    layouts = (("blocks", slots, slot, False), ("offsets", slots * slot, 4096, True))
    for context in map(int, args.contexts.split(",")):
        splits = choose_num_splits(context, rows, kvh, sms, capability)
        for n in map(int, args.lens.split(",")):
            lens = torch.full((rows,), n, dtype=torch.int32, device=dev)
            for pdl in (False, True):
                row, outs = {}, {}
                for name, table, block, offsets in layouts:
                    launch = functools.partial(
                        paged_decode_attention, q, k, v, table, lens, block, d**-0.5,
                        num_splits=splits, arrivals=arrivals, pdl=pdl, offsets=offsets,
                    )  # fmt: skip
                    outs[name] = launch()
                    row[name] = graph_us(launch)
                same = torch.equal(outs["blocks"], outs["offsets"])
                print(f"rows {rows} context {context} len {n} splits {splits} pdl {pdl}: "
                      f"blocks {row['blocks']:.2f} us, offsets {row['offsets']:.2f} us, "
                      f"same output {same}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
