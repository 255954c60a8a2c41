"""The kernel warm-up: which assemblies it takes, its children's outcomes, its time limit."""

import json
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import torch

from search.setup import SearchSpace
from search.trial import TrialRunner, pause_groups
from search.warmup import (
    AHEAD,
    WARM_BASE_S,
    WARM_S_PER_GIB,
    WarmAhead,
    ahead_workers,
    default_workers,
    has_triton_kernels,
    memory_workers,
    needed_s,
    queued_variants,
    warm_kernels,
    warm_limit_s,
    warm_queued,
    workers_for,
    workers_in_memory,
)
from variants.checkpoint.preflight import resolve_target
from variants.presets import PRESETS
from variants.probe import probe_capabilities
from variants.variant import Variant

# the search tests' fake engine: correct, crashing or hanging by variant
FAKE_RENDER = Path(__file__).parents[1] / "search" / "fake_render.py"
FAKE_RENDERER, MARKED_RENDERER = f"{FAKE_RENDER}:render_engine", f"{FAKE_RENDER}:render_marked"

optuna.logging.set_verbosity(optuna.logging.WARNING)

CORRECT = Variant(cache="slab", attention="sdpa")
CRASH = Variant(cache="contiguous", attention="sdpa")  # the fake renderer raises in create_engine
HANG = Variant(cache="paged", block_size=256, attention="sdpa")  # it sleeps in create_engine


def test_only_engines_with_triton_kernels_are_warmed():
    assert has_triton_kernels(PRESETS["slab-triton-pdl-allgraphs"], "variants.render:render_engine")
    assert has_triton_kernels(PRESETS["slab-triton-fused-graphs"], "variants.render:render_engine")
    assert not has_triton_kernels(PRESETS["slab-sdpa-graphs"], "variants.render:render_engine")
    assert not has_triton_kernels(PRESETS["safest"], "variants.render:render_engine")


def test_the_queued_assemblies_in_queue_order(tiny_config):
    study, queued = queued_study(tiny_config, [CORRECT, CRASH])
    assert queued_variants(study) == queued
    study.tell(study.ask(), values=[1.0, 1.0])  # the first one ran: no longer queued
    assert queued_variants(study) == queued[1:]


def test_each_child_reports_its_gate(tiny_config, tiny_weights):
    runner = TrialRunner(tiny_config, tiny_weights, "cpu", renderer=FAKE_RENDERER)
    runner.gate_cases = ("public",)
    warmed = warm_kernels(runner, [CORRECT, CRASH], limit_s=300, workers=2)
    assert [w.name for w in warmed] == [CORRECT.name, CRASH.name]
    assert [w.status for w in warmed] == ["ok", "failed"]
    assert warmed[0].reason == "" and "RuntimeError" in warmed[1].reason  # said why
    assert warmed[1].outcome().startswith(f"{CRASH.name}: failed (") and "RuntimeError" in (
        warmed[1].outcome()
    )
    assert all(0 < w.seconds < 300 for w in warmed)
    assert runner.durations == []  # warm-ups are not trials: no typical trial time from them


def test_a_hung_child_is_killed_at_the_limit_and_later_ones_do_not_start(tiny_config, tiny_weights):
    runner = TrialRunner(tiny_config, tiny_weights, "cpu", renderer=FAKE_RENDERER)
    start = time.monotonic()
    warmed = warm_kernels(runner, [HANG, CORRECT], limit_s=6, workers=1)
    assert time.monotonic() - start < 30  # killed at 6 s (plus the kill's grace)
    assert warmed[0].status == "timed out" and 5 < warmed[0].seconds < 30
    assert warmed[0].reason == "at the warm-up's limit, 6 s"
    assert warmed[1].status == "not started" and warmed[1].seconds == 0.0


def process_state(pid: int) -> str:
    """The state letter /proc gives a process (T: stopped), or "gone"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return "gone"


def wait_for(check, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while not check():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def test_a_proposal_warmed_ahead_is_stopped_while_a_trial_times_and_ended_with_the_search(
    tiny_config, tiny_weights
):
    runner = TrialRunner(tiny_config, tiny_weights, "cpu", renderer=FAKE_RENDERER)
    ahead = WarmAhead(runner, workers=1, limit_s=120)
    assert ahead.warm(HANG)  # its engine sleeps: a child that compiles for long
    (group,) = ahead.groups()
    assert not ahead.warm(CORRECT)  # one at a time here
    assert not ahead.warm(HANG)  # and once an assembly
    # A trial's child stops it before its timing (the groups its job names) ...
    pause_groups(ahead.groups())
    assert wait_for(lambda: process_state(group) == "T")
    time.sleep(0.3)
    assert process_state(group) == "T"  # it stays stopped
    # ... and the study continues it once the trial has ended
    ahead.resume()
    assert wait_for(lambda: process_state(group) not in ("T", "gone"))
    pause_groups(ahead.groups())  # stopped when the search ends: ended all the same
    note = ahead.close()
    assert wait_for(lambda: process_state(group) in ("gone", "Z"))
    assert ahead.groups() == [] and ahead.running() == 0
    assert note.startswith("warmed ahead: 1 proposals' kernels compiled while the trials before")
    assert "1 at most at once" in note and "0 finished" in note
    assert not ahead.warm(CORRECT)  # none after the end
    assert ahead.close() == note  # (again: the same note)


def test_a_child_warmed_ahead_leaves_its_kernels_and_counts_as_finished(tiny_config, tiny_weights):
    runner = TrialRunner(tiny_config, tiny_weights, "cpu", renderer=FAKE_RENDERER)
    runner.gate_cases = ("public",)
    ahead = WarmAhead(runner, workers=2, limit_s=120)
    assert ahead.warm(CORRECT)
    assert wait_for(lambda: ahead.running() == 0, 120)
    # never what Inductor builds (a child stopped inside its cache's lock would hold up a trial)
    assert not ahead.warm(Variant(cache="slab", attention="flex"))
    assert not ahead.warm(Variant(cache="slab", attention="sdpa", execution="compile"))
    assert ahead.started == 1 and ahead.finished == 1 and "1 finished" in ahead.close()
    assert runner.durations == []  # not a trial


def test_how_many_warm_ahead(tiny_config, tiny_weights):
    job = gpu_job(tiny_config, tiny_weights, workers=3)
    assert ahead_workers(job) == 3  # an explicit count
    job.args.warm_workers = 8
    assert ahead_workers(job) == AHEAD
    job.args.warm_workers = 0
    assert ahead_workers(job) == 0
    job.device, job.args.warm_workers = "cpu", None
    assert ahead_workers(job) == 0


def test_the_job_file_asks_for_the_gate_alone(tiny_config, tmp_path):
    runner = TrialRunner(tiny_config, "/weights", "cuda")
    cmd = runner.command(CORRECT, tmp_path, protocol="quick", check=True, traces=())
    job = json.loads((tmp_path / "job.json").read_text())
    assert cmd[-3:] == ["-m", "search.trial", str(tmp_path / "job.json")]
    assert job["traces"] == [] and job["check"] is True
    assert job["variant"] == CORRECT.to_dict() and job["engine_path"] == str(tmp_path / "engine.py")
    runner.command(CORRECT, tmp_path, paused=(7, 9))  # a trial's job: the runner's traces
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["traces"] == list(runner.traces) and job["pause_groups"] == [7, 9]


def test_no_warm_up_on_a_cpu_or_when_turned_off():
    cpu = SimpleNamespace(args=SimpleNamespace(warm_workers=None), device="cpu")
    assert warm_queued(cpu, study=None) == (None, [])
    off = SimpleNamespace(args=SimpleNamespace(warm_workers=0), device="cuda")
    assert warm_queued(off, study=None) == (None, [])
    assert 1 <= default_workers() <= 8


def queued_study(config, variants):
    """A study with `variants` enqueued as the main job enqueues them; their canonical forms."""
    space = SearchSpace(probe_capabilities("cpu", config))
    study = optuna.create_study(directions=["maximize", "minimize"])
    queued = [space.canonical(v) for v in variants]
    for v in queued:
        study.enqueue_trial(space.params_for(v), user_attrs={"variant": v.to_dict()})
    return study, queued


def gpu_job(config, weights, workers: int, trials=None):
    """A main job on a GPU as the warm-up sees it; its children run on the CPU, with the fake
    engine marked as one with kernels for slab variants."""
    runner = TrialRunner(config, weights, "cpu", renderer=MARKED_RENDERER)
    runner.gate_cases = ("public",)
    args = SimpleNamespace(warm_workers=workers, trials=trials)
    return SimpleNamespace(
        args=args,
        device="cuda",
        runner=runner,
        target=SimpleNamespace(weight_dir=weights),
        trial_timeout=300.0,
        budget_s=1200.0,
        seconds_left=lambda: 1000.0,
    )


def test_the_main_job_warms_the_queued_assemblies_with_kernels(tiny_config, tiny_weights):
    study, queued = queued_study(tiny_config, [CORRECT, Variant(cache="paged", attention="sdpa")])
    job = gpu_job(tiny_config, tiny_weights, workers=3)
    note, compiled = warm_queued(job, study)
    assert note.startswith(
        "kernel warm-up: 1 assembly with Triton kernels to run first, 1 at a time, in "
    )
    assert f"(limit 300 s): {queued[0].name}: ok, " in note
    assert queued[1].name not in note  # no kernels in its engine: not warmed
    assert len(queued_variants(study)) == 2  # the trials themselves are still to run
    # what it compiled is not warmed again when its trial is asked ahead of its turn
    assert compiled == [queued[0]]
    ahead = WarmAhead(job.runner, workers=2, limit_s=120, compiled=compiled)
    assert not ahead.warm(queued[0]) and ahead.started == 0


def test_no_more_warm_ups_than_trials_asked_for(tiny_config, tiny_weights):
    """`--trials 1`: only the first queued assembly is warmed."""
    study, queued = queued_study(tiny_config, [CORRECT, Variant(cache="slab", attention="manual")])
    note, _ = warm_queued(gpu_job(tiny_config, tiny_weights, workers=2, trials=1), study)
    assert note.startswith("kernel warm-up: 1 assembly with Triton kernels to run first")
    assert queued[0].name in note and queued[1].name not in note


GIB = 1 << 30


def test_the_warm_up_is_sized_by_the_model(tmp_path):
    """A share of the budget, or what the model's weights need if that is more: a child cut
    short loses its compile. Never over a trial's limit or what is left."""
    small, large = tmp_path / "small", tmp_path / "large"
    for folder, size in ((small, 10 * 2**20), (large, 4 * GIB)):
        folder.mkdir()
        with open(folder / "model.safetensors", "wb") as f:
            f.truncate(size)  # (sparse: no disk used)
    assert needed_s(large) == pytest.approx(WARM_BASE_S + 4 * WARM_S_PER_GIB)

    def job(weights, minutes, left=1e9):
        return SimpleNamespace(
            target=SimpleNamespace(weight_dir=weights),
            trial_timeout=300.0,
            budget_s=60.0 * minutes,
            seconds_left=lambda: left,
        )

    assert warm_limit_s(job(small, 20)) == 300.0  # a quarter of 20 minutes, the trial limit
    assert warm_limit_s(job(small, 3)) == pytest.approx(needed_s(small))  # over 45 s
    assert warm_limit_s(job(large, 3)) == pytest.approx(WARM_BASE_S + 4 * WARM_S_PER_GIB)
    assert warm_limit_s(job(large, 3, left=100.0)) == 100.0


def test_the_children_that_fit_in_the_gpus_memory():
    # the public config: 456 MB of float32 files, a first cache of 8192 tokens (288 MiB)
    weights, cache = 456 * 10**6, 288 * 2**20
    assert workers_in_memory(140 * GIB, weights, cache) == 65
    assert workers_in_memory(int(23.5 * GIB), weights, cache) == 11
    assert workers_in_memory(4 * GIB, weights, 3 * GIB) == 1  # never none by default


def test_warm_workers_given_is_taken_as_it_is(tiny_config, tiny_weights):
    job = gpu_job(tiny_config, tiny_weights, workers=5)
    assert workers_for(job) == 5  # no GPU is asked: an explicit count wins
    job.args.warm_workers = 0
    assert workers_for(job) == 0
    job.device, job.args.warm_workers = "cpu", 5
    assert workers_for(job) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_memory_bounds_the_default_count(tmp_path):
    """The public target on this GPU: as many children as its free memory holds (6 or more on
    an H200, so there the cores decide)."""
    target = resolve_target(None, None)
    if not (Path(target.weight_dir) / "model.pt").is_file():
        pytest.skip("the public target's weights are not generated")
    job = SimpleNamespace(device="cuda", target=target, args=SimpleNamespace(warm_workers=None))
    fits = memory_workers(job)
    free, total = torch.cuda.mem_get_info()
    assert fits >= 1
    assert fits * (1 << 30) <= 0.8 * free  # each child is counted at more than a GiB
    if total > 100 * (1 << 30):
        assert fits >= 6
    assert workers_for(job) == min(default_workers(), fits)


def test_a_trial_leaves_the_groups_it_held_running(tiny_config, tiny_weights):
    """(stopped while it times: `test_the_children_are_held_only_while_a_trace_is_timed`)"""
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        runner = TrialRunner(tiny_config, tiny_weights, "cpu", renderer=FAKE_RENDERER)
        runner.gate_cases, runner.traces = ("public",), ("prefill",)
        outcome = runner.run(CORRECT, paused=[sleeper.pid])
        assert outcome.status == "ok" and process_state(sleeper.pid) == "S"
    finally:
        sleeper.kill()
        sleeper.wait()


# --- a warm-up child's verdict, taken by its trial --------------------------------------------

WRONG = Variant(cache="slab", attention="manual", fuse_qkv=True)  # planted: logits off by 0.5


def verdict_runner(config, weights) -> TrialRunner:
    runner = TrialRunner(config, weights, "cpu", renderer=FAKE_RENDERER)
    runner.gate_cases, runner.traces = ("public",), ("prefill",)
    return runner


def test_a_trial_takes_the_verdict_its_warm_up_child_reached_on_the_same_file(
    tiny_config, tiny_weights
):
    runner = verdict_runner(tiny_config, tiny_weights)
    warm_kernels(runner, [CORRECT], limit_s=300, workers=1)
    assert set(runner.verdicts) == {json.dumps(CORRECT.to_dict(), sort_keys=True)}
    outcome = runner.run(CORRECT)
    assert outcome.status == "ok" and outcome.attrs["checked_ahead"] is True
    phases = outcome.attrs["phase_seconds"]
    assert "correctness" not in phases and "benchmark" in phases  # timed, the gate not run again
    assert outcome.attrs["check"]["public"]["passed"] is True  # the child's cases, recorded
    assert outcome.attrs["tps_prefill"] > 0
    assert runner.durations == [pytest.approx(outcome.attrs["trial_seconds"], abs=1e-3)]


def test_a_planted_fault_found_by_the_child_is_the_trials_verdict(tiny_config, tiny_weights):
    runner = verdict_runner(tiny_config, tiny_weights)
    warm_kernels(runner, [WRONG, CRASH], limit_s=300, workers=2)
    # a wrong engine's verdict is kept; a crash is not (its trial says why itself)
    assert list(runner.verdicts) == [json.dumps(WRONG.to_dict(), sort_keys=True)]
    outcome = runner.run(WRONG)
    assert outcome.status == "infeasible" and outcome.attrs["checked_ahead"] is True
    assert "benchmark" not in outcome.attrs["phase_seconds"]  # never timed
    assert outcome.constraint > 0
    crashed = runner.run(CRASH)
    assert crashed.status == "failed" and "checked_ahead" not in crashed.attrs


def test_a_verdict_on_another_file_is_not_taken(tiny_config, tiny_weights):
    """A passing verdict whose file differs from the one the trial renders (a forged digest
    here; a table or a renderer changed between them in a study): the trial runs the gate, and
    the planted fault is caught."""
    runner = verdict_runner(tiny_config, tiny_weights)
    warm_kernels(runner, [CORRECT], limit_s=300, workers=1)
    (verdict,) = runner.verdicts.values()
    runner.verdicts[json.dumps(WRONG.to_dict(), sort_keys=True)] = dict(verdict)
    outcome = runner.run(WRONG)
    assert outcome.status == "infeasible" and "checked_ahead" not in outcome.attrs
    assert "correctness" in outcome.attrs["phase_seconds"]


class WatchingEngine:
    """Records the state of a process at each call (a stand-in for a timed engine)."""

    def __init__(self, watched: int, seen: list, vocab: int):
        self.watched, self.seen, self.vocab = watched, seen, vocab

    def _logits(self, ids):
        self.seen.append(process_state(self.watched))
        return torch.zeros(len(ids), self.vocab)

    def prefill(self, request_ids, input_ids):
        return self._logits(request_ids)

    def decode(self, request_ids, token_ids):
        return self._logits(request_ids)

    def remove(self, request_ids):
        pass


def test_the_children_are_held_only_while_a_trace_is_timed(tiny_config, tiny_weights):
    from search.trial import measure

    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    built, seen = [], []

    def create_engine(config, weight_dir, device):
        built.append(process_state(sleeper.pid))  # the engine's build: the children run
        return WatchingEngine(sleeper.pid, seen, config["vocab_size"])

    job = {
        "protocol": "quick",
        "traces": ["prefill"],
        "config": tiny_config,
        "weight_dir": tiny_weights,
        "device": "cpu",
        "pause_groups": [sleeper.pid],
    }
    try:
        measure(create_engine, job)
        calls = len(seen) // 3  # a warm-up pass, then two timed
        assert built == ["S"] and calls > 0
        assert set(seen[:calls]) == {"S"}  # the warm-up pass: running (asleep)
        assert set(seen[calls:]) == {"T"}  # the repeats: stopped
        assert wait_for(lambda: process_state(sleeper.pid) == "S")  # continued after
    finally:
        sleeper.kill()
        sleeper.wait()


def test_results_log_says_how_many_trials_took_a_childs_verdict():
    from search.report import trial_time
    from search.trial import Record

    phases = {"render": 0.5, "correctness": 3.0, "benchmark": 3.0}
    records = [
        Record(0, "ok", None, {"phase_seconds": phases}),
        Record(
            1,
            "ok",
            None,
            {"phase_seconds": {"render": 0.5, "benchmark": 3.2}, "checked_ahead": True},
        ),
    ]
    line = trial_time(records)
    assert "medians of 2" in line and "correctness 3.0 s" in line
    assert line.endswith(
        "; 1 took the correctness verdict their warm-up child reached on the same "
        "engine file (the gate not run again)"
    )
    assert "verdict" not in trial_time(records[:1])
