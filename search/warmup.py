"""The kernel warm-up before a study's first trial: the queued assemblies' Triton kernels
compiled side by side; then, during the search, the next proposals' (`WarmAhead`). Each child
runs the correctness gate on the engine file its trial will render; its verdict is kept for
that trial (`TrialRunner.keep_verdict`), which then times its engine without running the gate
again.

An engine's first run compiles its Triton kernels on one CPU core, most of a trial for the
fused-pdl preset (experiments/compile_reuse.py; numbers in docs/PERF.md). Triton keeps them on
disk, keyed by source and line, so a child that renders the same file and runs the correctness
gate leaves them for the trial. Several children run at once and nothing is timed meanwhile;
one that fails or runs out of time costs only its seconds (its trial compiles what is still
missing).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from search.trial import assembly_key, load_renderer, run_child
from variants.registry import AXES_BY_NAME
from variants.spec import ModelSpec
from variants.variant import Variant

log = logging.getLogger(__name__)

# The warm-up's limit: a share of the job's budget, or what the model needs if that is more
# (a cut child loses its compile, which its trial then does alone), never more than a trial's.
BUDGET_SHARE = 0.25
# What the model needs: the compiles (results.log's warm-up line says what they took) and, a
# GiB of weights, an allowance for each child's loads (the reference and two engines) and its
# float32 reference's steps.
WARM_BASE_S, WARM_S_PER_GIB = 75.0, 30.0
# The children warming the trials asked of the sampler ahead of their turn while the trials
# before them run (`WarmAhead`): at most this many at once.
AHEAD = 4
# The trials asked ahead: up to this many a child (each proposed without the results of those
# before it). A child's gate takes several pruned trials' time, so with one asked trial a child
# the children wait on the trials and the trials then on children just started (the trial runs
# the gate itself beside its child): asked further ahead, a finished child's slot goes to the
# next proposal when the next trial starts (docs/PERF.md, the 8-minute study).
ASKED_PER_CHILD = 2
# The choices that compile with Inductor, never warmed ahead: Inductor's cache takes file locks,
# and a child stopped while it holds one would hold up a trial that compiles while it times
# (and a flex trial warmed ahead still traces in its own process: docs/PERF.md).
INDUCTOR = {"execution": ("compile",), "attention": ("flex",)}
# A child's gate statuses that mean it ran to its end, every kernel of the gate compiled (a wrong
# engine's too): its trial's turn needs no second warm-up.
COMPILED = ("ok", "infeasible")
# Beyond its weights and cache a child's engine takes up to about 0.9 GiB at a trial's peak
# (graph pools, workspaces; experiments/engine_memory.py).
CHILD_EXTRA_BYTES = 1 << 30


@dataclass
class Warmed:
    name: str
    status: str  # the gate's status (ok, infeasible, failed), "timed out" or "not started"
    seconds: float
    reason: str = ""  # what ended a child that did not pass: its error, or the limit

    def outcome(self) -> str:
        return f"{self.name}: {self.status}{f' ({self.reason})' if self.reason else ''}, " + (
            f"{self.seconds:.0f} s"
        )


def default_workers() -> int:
    """Half the CPU cores, at most eight: each child compiles on one core, and six children on
    16 cores take as long as the slowest of them alone."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def workers_in_memory(free_bytes: int, weight_bytes: int, cache_bytes: int) -> int:
    """How many children fit in 80% of the GPU's free memory, each as much as one engine alone
    takes: its weights, a cache of `cache_bytes` and `CHILD_EXTRA_BYTES`. At least one."""
    return max(1, int(0.8 * free_bytes) // (weight_bytes + cache_bytes + CHILD_EXTRA_BYTES))


def memory_workers(job) -> int:
    """`workers_in_memory` for this job's GPU and model: the weights at their files' size (an
    upper bound: float32 files load as float16), the cache as large as the largest first one
    an assembly may choose (the gate's traces stay near it)."""
    device = torch.device(job.device)
    free, _ = torch.cuda.mem_get_info(device)
    spec = ModelSpec.from_config(job.target.config)
    cache = max(AXES_BY_NAME["cache_tokens"].values) * spec.kv_bytes_per_token(
        spec.compute_dtype(device)
    )
    weights = sum(p.stat().st_size for p in Path(job.target.weight_dir).iterdir() if p.is_file())
    return workers_in_memory(free, weights, cache)


def needed_s(weight_dir) -> float:
    """What a warm-up child needs for the model in `weight_dir` (its files' size)."""
    weights = sum(p.stat().st_size for p in Path(weight_dir).iterdir() if p.is_file())
    return WARM_BASE_S + WARM_S_PER_GIB * weights / 2**30


def warm_limit_s(job) -> float:
    """The warm-up's seconds: `BUDGET_SHARE` of the budget or the model's need, the more,
    within the trial limit and what is left of the budget."""
    need = needed_s(job.target.weight_dir)
    return min(job.trial_timeout, max(BUDGET_SHARE * job.budget_s, need), job.seconds_left())


def has_triton_kernels(variant, renderer: str) -> bool:
    with tempfile.TemporaryDirectory(prefix="warm-") as tmp:
        path = Path(tmp) / "engine.py"
        load_renderer(renderer)(variant, path, "")
        return "@triton.jit" in path.read_text()


def queued_variants(study) -> list:
    """The study's enqueued, not yet run assemblies, in queue order."""
    from optuna.trial import TrialState

    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    return [
        Variant.from_dict(t.user_attrs["variant"]) for t in waiting if "variant" in t.user_attrs
    ]


def warm_kernels(runner, variants, limit_s: float, workers: int) -> list[Warmed]:
    """Render each variant as its trial will and run the correctness gate alone, `workers` at a
    time, all of it within `limit_s`; each child's outcome."""
    deadline = time.monotonic() + limit_s

    def one(variant) -> Warmed:
        left = deadline - time.monotonic()
        if left < 1.0:
            return Warmed(variant.name, "not started", 0.0)
        with tempfile.TemporaryDirectory(prefix="warm-") as tmp:
            tmp = Path(tmp)
            cmd = runner.command(variant, tmp, protocol="quick", check=True, traces=())
            code, seconds = run_child(cmd, tmp / "log.txt", left)
            result = tmp / "result.json"
            if code is None:
                status, reason = "timed out", f"at the warm-up's limit, {limit_s:.0f} s"
            elif result.is_file():
                data = json.loads(result.read_text())
                status, reason = data["status"], data.get("reason") or ""
                runner.keep_verdict(variant, data)
            else:
                lines = (tmp / "log.txt").read_text(errors="replace").strip().splitlines()
                status, reason = f"exit code {code}", lines[-1] if lines else ""
        warmed = Warmed(variant.name, status, seconds, " ".join(reason.split())[:200])
        log.info("warm-up of %s in %.1f s", warmed.outcome(), seconds)
        return warmed

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, variants))


def workers_for(job) -> int:
    """How many children at once: `--warm-workers`, else `default_workers()` or as many as fit
    in the GPU's memory, the fewer; 0 off a GPU."""
    if not job.device.startswith("cuda"):
        return 0
    if job.args.warm_workers is not None:
        return max(0, job.args.warm_workers)
    return min(default_workers(), memory_workers(job))


def warm_queued(job, study) -> tuple[str | None, list]:
    """`warm_first` over the study's queued assemblies, those that `--trials` leaves room for."""
    if not workers_for(job):
        return None, []
    from search.study import started_trials  # (Optuna: imported where a study is open)

    queued = queued_variants(study)
    if job.args.trials is not None:
        queued = queued[: max(0, job.args.trials - len(started_trials(study)))]
    return warm_first(job, queued)


def warm_first(job, variants: list) -> tuple[str | None, list]:
    """Warm the kernels of those `variants` that have Triton kernels, on a GPU unless
    `--warm-workers 0`: a note for the results log (None when nothing ran) and the variants
    whose child ran the gate to its end (their kernels compiled: `COMPILED`)."""
    workers = workers_for(job)
    if not workers:
        return None, []
    variants = [v for v in variants if has_triton_kernels(v, job.runner.renderer)]
    if not variants:
        return None, []
    limit = warm_limit_s(job)
    start = time.monotonic()
    warmed = warm_kernels(job.runner, variants, limit, workers)
    outcomes = "; ".join(w.outcome() for w in warmed)
    compiled = [v for v, w in zip(variants, warmed) if w.status in COMPILED]
    return (
        f"kernel warm-up: {len(variants)} {'assembly' if len(variants) == 1 else 'assemblies'} "
        f"with Triton kernels to run first, {min(workers, len(variants))} at a time, in "
        f"{time.monotonic() - start:.0f} s (limit {limit:.0f} s): {outcomes}"
    ), compiled


class WarmAhead:
    """The next trials' kernels compiled while the current one runs: for each proposal asked
    ahead, a child that renders it and runs the correctness gate alone (as `warm_kernels`), at
    most `workers` at once, each within `limit_s`. A trial's child stops these children's
    process groups while it times a trace's repeats (`trial.held`) and `resume` continues them
    once the trial has ended (one killed while it held them); `close` ends those still running
    (what they compiled stays in Triton's and Inductor's caches for the trials). `compiled`:
    assemblies the kernel warm-up compiled already (`warm_first`), never warmed again."""

    def __init__(self, runner, workers: int, limit_s: float, compiled=()):
        self.runner, self.workers, self.limit_s = runner, workers, limit_s
        self.depth = ASKED_PER_CHILD * workers  # the trials asked ahead at most
        self.started = self.finished = 0
        self._groups: dict[int, int] = {}  # child -> its process group while it runs
        self._threads: list[threading.Thread] = []
        self._warmed: set[str] = {assembly_key(v) for v in compiled}
        self._lock = threading.Lock()
        self._closing = False

    def running(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    def warm(self, variant) -> bool:
        """Start a child for `variant` unless one ran or runs for it, `workers` run, or it
        compiles with Inductor (`INDUCTOR`); whether one started. Returns once the child's
        process group is known (or its start failed)."""
        key = assembly_key(variant)
        if self._closing or key in self._warmed or self.running() >= self.workers:
            return False
        if any(getattr(variant, axis) in values for axis, values in INDUCTOR.items()):
            return False
        self._warmed.add(key)
        ready = threading.Event()
        thread = threading.Thread(
            target=self._child, args=(len(self._threads), variant, ready), daemon=True
        )
        self._threads.append(thread)
        self.started += 1
        thread.start()
        ready.wait(30.0)
        return True

    def _child(self, index: int, variant, ready: threading.Event) -> None:
        def started(pid: int) -> None:
            with self._lock:
                self._groups[index] = pid
                closing = self._closing
            if closing:  # `close` came first: this one never warms
                _signal_group(pid, signal.SIGKILL)
            ready.set()

        try:
            with tempfile.TemporaryDirectory(prefix="warm-") as tmp:
                tmp = Path(tmp)
                cmd = self.runner.command(variant, tmp, protocol="quick", check=True, traces=())
                code, seconds = run_child(cmd, tmp / "log.txt", self.limit_s, started)
                if code == 0 and (tmp / "result.json").is_file():
                    self.runner.keep_verdict(variant, json.loads((tmp / "result.json").read_text()))
            log.info("warmed ahead: %s, exit %s in %.1f s", variant.name, code, seconds)
            if code == 0:
                with self._lock:
                    self.finished += 1
        finally:
            with self._lock:
                self._groups.pop(index, None)
            ready.set()

    def groups(self) -> list[int]:
        """The process groups of the children running now."""
        with self._lock:
            return list(self._groups.values())

    def resume(self) -> None:
        """Continue the children a trial stopped."""
        for group in self.groups():
            _signal_group(group, signal.SIGCONT)

    def close(self) -> str | None:
        """End the children still running (a stopped one too); a note for the results log, or
        None when none started."""
        with self._lock:
            self._closing = True
        for group in self.groups():
            _signal_group(group, signal.SIGKILL)
        for thread in self._threads:
            thread.join(15.0)
        if not self.started:
            return None
        return (
            f"warmed ahead: {self.started} proposals' kernels compiled while the trials before "
            f"them ran, {self.workers} at most at once (stopped while a trial timed a trace); "
            f"{self.finished} finished, the rest ended with the search"
        )


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):  # (it ended meanwhile)
        pass


def ahead_workers(job) -> int:
    """How many children warm ahead: `workers_for`'s count less one (the trial running beside
    them holds an engine too), at most AHEAD; 0 off a GPU or with `--warm-workers 0`."""
    workers = workers_for(job)
    if not workers:
        return 0
    fit = memory_workers(job) - 1 if job.args.warm_workers is None else workers
    return max(0, min(AHEAD, workers, fit))


def warm_ahead(job, compiled=()) -> WarmAhead | None:
    """The search's `WarmAhead` for this job (each child within a trial's limit; `compiled`: the
    assemblies the kernel warm-up compiled), or None where `ahead_workers` is 0."""
    workers = ahead_workers(job)
    return WarmAhead(job.runner, workers, job.trial_timeout, compiled) if workers else None
