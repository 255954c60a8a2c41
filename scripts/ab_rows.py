"""The rows of an A/B (`ab_bench.sh`, `gpu_check.sh handab`): one benchmark's JSON report added
to a JSON-lines file, a line a trace; then each (trace, harness, engine)'s median over the rounds.

    python scripts/ab_rows.py add ROWS.jsonl REPORT.json round=1 tree=base [key=value ...]
    python scripts/ab_rows.py medians ROWS.jsonl
"""

import collections
import json
import statistics
import sys


def add(rows_path: str, report_path: str, fields: list[str]) -> None:
    extra = {}
    for field in fields:
        key, _, value = field.partition("=")
        extra[key] = int(value) if value.isdigit() else value
    report = json.load(open(report_path))
    with open(rows_path, "a") as out:
        for trace, t in report["traces"].items():
            row = {**extra, "trace": trace, "ms": 1e3 * t["seconds"], "peak_mib": t.get("peak_mib")}
            out.write(json.dumps(row) + "\n")


def medians(rows_path: str) -> None:
    rows = collections.defaultdict(list)
    for line in open(rows_path):
        r = json.loads(line)
        rows[r["trace"], r.get("harness", "own"), r["tree"]].append(r["ms"])
    for (trace, harness, tree), ms in sorted(rows.items()):
        print(
            f"{trace:12s} harness {harness:4s} {tree:8s} median {statistics.median(ms):.4f} ms of",
            [round(m, 4) for m in ms],
        )


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "add":
        add(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif len(sys.argv) == 3 and sys.argv[1] == "medians":
        medians(sys.argv[2])
    else:
        sys.exit("usage: ab_rows.py add ROWS.jsonl REPORT.json KEY=VALUE... | medians ROWS.jsonl")
