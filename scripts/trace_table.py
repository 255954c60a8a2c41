"""Engines' benchmark_throughput.py reports side by side: a row an engine (the file's name
after its first "_"), a column a trace, ms (median of the fresh engines) and the peak MiB.

    python scripts/trace_table.py workspace/gpu_check/knob_*.json
"""

import json
import sys
from pathlib import Path


def main(paths: list) -> int:
    rows = {Path(p).stem.split("_", 1)[-1]: json.loads(Path(p).read_text()) for p in paths}
    traces = sorted({t for r in rows.values() for t in r["traces"]})
    print("engine".ljust(10) + "".join(t[:12].rjust(13) for t in traces) + "   (ms; peak MiB)")
    for name, report in rows.items():
        cells = [report["traces"].get(t) for t in traces]
        ms = (f"{1e3 * c['seconds']:.3f}" if c else "-" for c in cells)
        peak = (str(int(c["peak_mib"])) if c else "-" for c in cells)
        print(name.ljust(10) + "".join(x.rjust(13) for x in ms))
        print("".ljust(10) + "".join(x.rjust(13) for x in peak))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
