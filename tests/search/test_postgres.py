"""A study on a real PostgreSQL server: `run` and two workers share it, a killed worker's trial is
failed by the next process (heartbeats), and the verified best is there for every process.

Needs AUTOTUNER_TEST_POSTGRES, a server URL (`bash scripts/postgres_for_tests.sh start` prints
one; `.ci/run` starts it); each test gets a database of its own. Engines come from
`fake_render.py`, so a trial costs seconds.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from search import study as st
from search.setup import SearchSpace
from variants.probe import probe_capabilities
from variants.variant import Variant

optuna.logging.set_verbosity(optuna.logging.WARNING)
SERVER = os.environ.get("AUTOTUNER_TEST_POSTGRES")
pytestmark = pytest.mark.skipif(
    not SERVER, reason="AUTOTUNER_TEST_POSTGRES is unset (scripts/postgres_for_tests.sh start)"
)
REPO_ROOT = Path(__file__).resolve().parents[2]
TRIALS = 5
HEARTBEAT = "2"  # seconds; a trial silent for 6 s is stale: live ones must keep beating
HANG = Variant(cache="paged", block_size=256, attention="sdpa")  # fake_render: sleeps an hour
FAST = Variant(cache="slab", attention="sdpa")  # fake_render: correct, no delay


@pytest.fixture
def database():
    """A fresh database on the server (earlier studies there would be enqueued as known-good)."""
    psycopg = pytest.importorskip("psycopg")
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield SERVER.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def search(args: list[str], env: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "search", *args, "--heartbeat", HEARTBEAT]
    return subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.2)
    pytest.fail(f"{what} within {timeout:.0f} s")


def trials_of(url: str, name: str, states=None) -> list:
    if name not in optuna.get_all_study_names(url):
        return []
    return optuna.load_study(study_name=name, storage=url).get_trials(states=states)


def ran_here(log: str) -> set[int]:
    """The trials a process ran: "trial N <variant name>: ..." (not "trial N failed: ...", the
    stale trials it failed)."""
    return set(map(int, re.findall(r"search\.study: trial (\d+) [a-z0-9]+/", log)))


def test_run_and_two_workers_share_the_study(
    database, tmp_path, micro_config_path, tiny_weights, fake_renderer, child_env
):
    # `run`'s engines are built 3 s slower than the workers', so that the workers, which
    # start once it has queued its trials, are up before it could run all of them alone (on a
    # loaded machine their start-up takes several of its fake trials).
    run_env = dict(child_env, FAKE_ENGINE_CREATE_S="3")
    run = search(
        [
            "run", "--model-config", str(micro_config_path), "--weight-dir", tiny_weights,
            "--device", "cpu", "--storage", database, "--study", "shared", "--trials", str(TRIALS),
            "--trial-timeout", "60", "--budget-minutes", "8", "--remeasure", "0",
            "--traces", "decode", "--renderer", fake_renderer, "--workspace", str(tmp_path / "ws"),
            "--studies-dir", str(tmp_path / "studies"), "--seed", "0",
        ],
        run_env,
    )  # fmt: skip
    # Workers join once `run` has recorded the model and queued the known-good assemblies.
    wait_for(lambda: trials_of(database, "shared"), 60, "run queued no trial")
    workers = [
        search(
            [
                "worker",
                "--storage",
                database,
                "--study",
                "shared",
                "--device",
                "cpu",
                "--trials",
                str(TRIALS),
                "--renderer",
                fake_renderer,
                "--trial-timeout",
                "60",
                "--seed",
                str(seed),
            ],
            child_env,
        )  # fmt: skip
        for seed in (1, 2)
    ]
    logs = [p.communicate(timeout=300)[0] for p in (run, *workers)]
    assert [p.returncode for p in (run, *workers)] == [0, 0, 0], [log[-3000:] for log in logs]

    trials = trials_of(database, "shared")
    counted = st.started_trials(optuna.load_study(study_name="shared", storage=database))
    assert len(counted) == TRIALS  # the target met, not overshot
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    # A sampled assembly may hit a planted fault (fake_render) and fail on its own; what must not
    # happen is another process failing a live trial as stale.
    stale = [(t.number, t.user_attrs) for t in counted if "stale" in t.user_attrs.get("reason", "")]
    assert not stale, f"a live trial was failed as stale: {stale}"
    # Every trial run by exactly one process: their logs name disjoint trial numbers, which
    # together are the study's trials (a skipped one is told, not run).
    ran = [ran_here(log) for log in logs]
    assert sum(map(len, ran)) == len(set().union(*ran)) == TRIALS
    assert set().union(*ran) == {t.number for t in counted}
    assert ran[1] | ran[2], "the workers ran no trial: nothing was shared"
    queued = [t.user_attrs for t in counted if t.user_attrs.get("source")]
    sources = [(a["source"], a["variant_name"]) for a in queued]
    assert len(sources) == len(set(sources))  # each queued assembly popped once

    # The verified best, as `run` wrote it, read back by another process.
    code = (
        "import json, sys, optuna; "
        "s = optuna.load_study(study_name='shared', storage=sys.argv[1]); "
        "print(json.dumps(s.user_attrs['verified_best']))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code, database], env=child_env, capture_output=True, text=True
    )
    assert other.returncode == 0, other.stderr[-2000:]
    best = json.loads(other.stdout)
    here = optuna.load_study(study_name="shared", storage=database).user_attrs["verified_best"]
    assert best == here and best["n_trials"] == TRIALS
    assert best["trial"] in {t.number for t in counted if t.state == TrialState.COMPLETE}
    engine = (tmp_path / "ws" / "engine.py").read_text()
    assert f"Fake engine for {Variant.from_dict(best['variant']).name}" in engine


def test_a_killed_workers_trial_is_failed_by_the_next_worker(
    database, micro_config_path, tiny_config, tiny_weights, fake_renderer, child_env, processes
):
    caps = probe_capabilities("cpu", tiny_config)
    space = SearchSpace(caps)
    study = st.open_study(st.open_storage(database), "killed")
    for key, value in {
        "model_config_path": str(micro_config_path),
        "weight_dir": tiny_weights,
        "hardware": st.hardware_key(caps),
        "traces": ["decode"],
    }.items():
        study.set_user_attr(key, value)
    for source, variant in (("hang", HANG), ("fast", FAST)):  # popped in this order
        study.enqueue_trial(
            space.params_for(space.canonical(variant)), user_attrs={"source": source}
        )
    args = ["worker", "--storage", database, "--study", "killed", "--device", "cpu"]
    args += ["--trials", "2", "--renderer", fake_renderer, "--trial-timeout", "120"]

    first = search(args, child_env)
    hung = wait_for(
        lambda: trials_of(database, "killed", (TrialState.RUNNING,)), 60, "no trial started"
    )[0]
    assert hung.user_attrs["source"] == "hang"
    # The trial beats from before its process starts; that process (forked from the worker's
    # forkserver, its output in its folder's log.txt) watches its parent from before its first
    # phase.
    trial = wait_for(
        lambda: processes.trial_logs(first.pid), 30, "the trial's process did not start"
    )
    folder = next(iter(trial.values())).parent
    wait_for((folder / "result.json.phase").exists, 30, "the trial's first phase")
    below = processes.descendants(first.pid)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    # The trial's own process stops with its worker (it would hold a GPU for the next trial),
    # and so does the forkserver.
    wait_for(
        lambda: not any(processes.alive(pid) for pid in below),
        10,
        "the orphaned trial kept running",
    )
    assert [t.state for t in trials_of(database, "killed")] == [
        TrialState.RUNNING,
        TrialState.WAITING,
    ]

    time.sleep(3 * int(HEARTBEAT) + 1.5)  # the grace period, by the database's clock
    second = search(args, child_env)
    log = second.communicate(timeout=120)[0]
    assert second.returncode == 0, log[-3000:]
    trials = trials_of(database, "killed")
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE], log[-3000:]
    dead = trials[0].user_attrs
    assert dead["status"] == "failed" and "stopped beating" in dead["reason"]
    assert ran_here(log) == {1}  # the next worker ran the one trial left to the target
