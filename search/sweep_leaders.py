"""The short shape sweep at the end of run.sh: the study's leaders measured by `python -m search
sweep` in a child process into `<study dir>/sweep.json`, next to the report, small enough on a
CPU and time-limited on a GPU; kept as it is when a resumed study would sweep the same again.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from search.sweep_command import PIPELINE_TOP, SWEEP_FILE
from search.sweep_variants import study_variants

log = logging.getLogger("search.sweep_command")  # the sweep's lines in run.sh's log keep one name

# run.sh: the defaults on a GPU, adding shapes for at most 90 s (less when the budget is nearly
# spent, never under 20 s: the figures need a few shapes); on a CPU small shapes for 10 s, and no
# torch.compile variant (its build alone took 12 s on the tiny test model).
PIPELINE_SETTINGS = {
    "cpu": ["--batches", "1,2,4", "--lengths", "16,64", "--repeats", "2"],
    "cuda": [],
}
PIPELINE_LIMIT_S = {"cpu": 10.0, "cuda": 90.0}
MIN_GPU_LIMIT_S = 20.0
PIPELINE_COMPILE = {"cpu": False, "cuda": True}
PIPELINE_TIMEOUT_S = {"cpu": 120.0, "cuda": 400.0}  # engine builds come on top of the limit
# The least the sweep takes on a GPU: its 20 s of shapes and its engines' builds, 28 s on an H200
# (48 s in all at the 20 s limit).
LEAST_GPU_S = MIN_GPU_LIMIT_S + 28.0


def sweep_leaders(job, reuse: bool) -> list[str]:
    """Sweep the study's best (up to 3) distinct correct variants in a child process into
    `<study dir>/sweep.json`, next to the report; returns notes for results.log. `reuse`: keep
    an existing sweep.json of the same variants and device (a resumed study). Never raises.
    The child gets the variants by value and skips the probe: it then imports neither Optuna
    nor torch._dynamo, a few seconds less on a CPU."""
    from search.summary_md import default_report_dir
    from search.trial import run_child, tail

    out = default_report_dir(job.storage_url, job.study_name, job.args.studies_dir) / SWEEP_FILE
    try:
        kind = "cuda" if job.device.startswith("cuda") else "cpu"
        chosen = study_variants(job.study, PIPELINE_TOP, PIPELINE_COMPILE[kind])
        wanted = [v.to_dict() for _, v in chosen]
        left_out = "" if PIPELINE_COMPILE[kind] else " (torch.compile variants left out on a CPU)"
        if not wanted:
            return [f"shape sweep: no variant to sweep{left_out}"]
        if reuse and _same_sweep(out, wanted, job.device):
            return [f"shape sweep: kept {out} (same variants, same device)"]
        cmd = [sys.executable, "-m", "search", "sweep", "--out", str(out.resolve()), "--no-probe"]
        for name, variant in chosen:
            cmd += ["--variant", f"{name}={json.dumps(variant.to_dict())}"]
        cmd += ["--model-config", str(job.target.config_path)]
        cmd += ["--weight-dir", str(job.target.weight_dir), "--device", job.device]
        cmd += PIPELINE_SETTINGS[kind]
        cmd += ["--time-limit", f"{sweep_limit(kind, job.seconds_left()):.0f}"]
        if job.runner.ceilings:
            cmd += ["--ceilings", json.dumps(job.runner.ceilings)]
        out.parent.mkdir(parents=True, exist_ok=True)
        log_path = out.with_name("sweep.log")
        log.info("shape sweep of %d variant(s) into %s", len(wanted), out)
        code, seconds = run_child(cmd, log_path, PIPELINE_TIMEOUT_S[kind])
    except Exception as exc:  # a diagram is not worth the engine
        log.warning("the shape sweep failed: %r", exc)
        return [f"shape sweep failed: {exc!r}"]
    status = "timed out" if code is None else f"exit {code}"
    note = (
        f"shape sweep of {len(wanted)} variant(s){left_out} ({status}, {seconds:.0f} s): {out}, "
        f"output in {log_path}"
    )
    if code != 0:
        log.warning("the shape sweep ended with %s:\n%s", status, tail(log_path, 1500))
        note += " — " + (tail(log_path, 300).splitlines() or ["no output"])[-1]
    return [note]


def least_sweep_s(kind: str) -> float:
    """What the sweep takes at the least: on a GPU `LEAST_GPU_S`, on a CPU its limit."""
    return PIPELINE_LIMIT_S["cpu"] if kind == "cpu" else LEAST_GPU_S


def sweep_limit(kind: str, seconds_left: float) -> float:
    """Seconds of shapes for the sweep: on a GPU what is left of the job's budget, within
    20-90 s; on a CPU always 10."""
    if kind == "cpu":
        return PIPELINE_LIMIT_S["cpu"]
    return max(MIN_GPU_LIMIT_S, min(PIPELINE_LIMIT_S["cuda"], seconds_left))


def _same_sweep(path: Path, variants: list[dict], device: str) -> bool:
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    entries = old.get("variants") or []
    return (
        old.get("device") == device
        and [v.get("variant") for v in entries] == variants
        and not any(v.get("error") for v in entries)
    )
