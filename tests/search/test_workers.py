"""Two worker processes on one journal storage share a trial target: N trials, each run once."""

import json
import re
import subprocess
import sys
from pathlib import Path

import optuna
from optuna.trial import TrialState

from search import study as st
from search.setup import SearchSpace
from search.study import enqueue_known_good
from variants.probe import probe_capabilities
from variants.variant import Variant

optuna.logging.set_verbosity(optuna.logging.WARNING)
REPO_ROOT = Path(__file__).resolve().parents[2]
TARGET = 4


def test_two_workers_complete_the_target_together(
    tmp_path, micro_config_path, tiny_weights, fake_renderer, child_env
):
    config = json.loads(micro_config_path.read_text())
    caps = probe_capabilities("cpu", config)
    url = f"journal:{tmp_path}/journal.log"
    storage = st.open_storage(url)
    study = st.open_study(storage, "shared")
    # What `run` records, so that workers need only the storage and the study name.
    study.set_user_attr("model_config", config)
    study.set_user_attr("model_config_path", str(micro_config_path))
    study.set_user_attr("weight_dir", tiny_weights)
    study.set_user_attr("hardware", st.hardware_key(caps))
    study.set_user_attr("traces", ["prefill"])
    queued = enqueue_known_good(study, SearchSpace(caps), caps, storage, "shared", "x", None)
    assert queued  # both workers start on the same queue of known-good assemblies

    workers = []
    for seed in (1, 2):
        cmd = [sys.executable, "-m", "search", "worker", "--storage", url, "--study", "shared"]
        cmd += ["--device", "cpu", "--trials", str(TARGET), "--renderer", fake_renderer]
        cmd += ["--trial-timeout", "120", "--seed", str(seed)]
        workers.append(
            subprocess.Popen(
                cmd,
                cwd=REPO_ROOT,
                env=child_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )  # fmt: skip
        )
    logs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], logs

    trials = st.load_study(st.open_storage(url), "shared").get_trials()
    run = [
        t
        for t in trials
        if t.user_attrs.get("status") != "skipped" and t.state != TrialState.WAITING
    ]
    assert len(run) == TARGET
    assert all(t.state in (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED) for t in run)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    # Each trial was run by exactly one worker: the numbers in their logs are disjoint and
    # together they are the study's trials.
    ran = [set(map(int, re.findall(r"search.study: trial (\d+) ", log))) for log in logs]
    assert not ran[0] & ran[1]
    assert ran[0] | ran[1] == {t.number for t in run}
    # Each queued assembly (the presets, the search's own after a repeat) popped once.
    sources = [
        (t.user_attrs["source"], t.user_attrs["variant_name"])
        for t in run
        if t.user_attrs.get("source")
    ]
    assert len(sources) == len(set(sources))
    for t in run:
        if t.state == TrialState.COMPLETE:
            assert t.user_attrs["tps_prefill"] > 0


def test_a_killed_workers_trial_and_forkserver_stop_with_it(
    tmp_path, micro_config_path, tiny_weights, fake_renderer, child_env, processes
):
    """A trial forked from the worker's forkserver stops when the worker is killed (it would hold
    a GPU for the next trial), and so does the forkserver."""
    import signal
    import time

    config = json.loads(micro_config_path.read_text())
    caps = probe_capabilities("cpu", config)
    url = f"journal:{tmp_path}/journal.log"
    study = st.open_study(st.open_storage(url), "killed")
    study.set_user_attr("model_config_path", str(micro_config_path))
    study.set_user_attr("weight_dir", tiny_weights)
    study.set_user_attr("traces", ["decode"])
    space = SearchSpace(caps)
    hang = Variant(cache="paged", block_size=256, attention="sdpa")  # fake_render: sleeps
    study.enqueue_trial(space.params_for(space.canonical(hang)), user_attrs={"source": "hang"})
    cmd = [sys.executable, "-m", "search", "worker", "--storage", url, "--study", "killed"]
    cmd += ["--device", "cpu", "--trials", "1", "--renderer", fake_renderer]
    worker = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 60
    while not processes.trial_logs(worker.pid):
        assert time.monotonic() < deadline and worker.poll() is None, "no trial started"
        time.sleep(0.2)
    below = processes.descendants(worker.pid)
    worker.send_signal(signal.SIGKILL)
    worker.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while any(processes.alive(pid) for pid in below):
        assert time.monotonic() < deadline, "the orphaned trial or its forkserver kept running"
        time.sleep(0.2)
