"""Fixtures of the search tests: a shorter-context test model, the fake renderer, a child env."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
FAKE_RENDERER = f"{Path(__file__).parent / 'fake_render.py'}:render_engine"


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Engines measured in the test process (the shape sweep) on one thread: two cores are
    shared, and oversubscribed threads made the sweep four times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def micro_config_path(tiny_config, tmp_path_factory) -> Path:
    """The tiny test model with a 64-token context: the stress case scales with the context and
    takes a quarter of the time. Same weights as the tiny model."""
    path = tmp_path_factory.mktemp("micro") / "model_config.json"
    path.write_text(json.dumps(dict(tiny_config, max_position_embeddings=64)))
    return path


@pytest.fixture(scope="session")
def child_env() -> dict:
    """One torch thread per process: several test processes share two cores, and oversubscribed
    CPU threads made the correctness check ten times slower (measured: 55 s against 4 s)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture(scope="session")
def fake_renderer() -> str:
    return FAKE_RENDERER


@pytest.fixture(scope="session")
def search_cli(child_env):
    """`python -m search ARGS` in a child process from the repository root."""

    def run(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "search", *args],
            cwd=REPO_ROOT,
            env=child_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture
def dashboard_server():
    """`start(storage_url)`: the base URL of an optuna-dashboard serving that storage once it
    answers; stopped after the test. Skips when optuna-dashboard is not installed."""
    if shutil.which("optuna-dashboard") is None:
        pytest.skip("optuna-dashboard is not installed")
    servers = []

    def start(url: str) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = ["optuna-dashboard", url, "--host", "127.0.0.1", "--port", str(port)]
        server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        servers.append(server)
        base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 25
        while time.monotonic() < deadline:
            if server.poll() is not None:
                pytest.fail(f"optuna-dashboard exited: {server.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/studies", timeout=5):
                    return base
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.3)
        pytest.fail("optuna-dashboard did not answer within 25 s")

    yield start
    for server in servers:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="session")
def fresh_check(child_env):
    """The evaluator's correctness CLI (public + stress) on an engine file, in a fresh process."""

    def run(engine: Path, config: Path, weight_dir: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "evaluator/test_correctness.py", "--engine", str(engine), "--stress"]
        cmd += ["--model-config", str(config), "--weight-dir", weight_dir, "--device", "cpu"]
        return subprocess.run(
            cmd, cwd=REPO_ROOT, env=child_env, capture_output=True, text=True, timeout=600
        )

    return run


# --- a demo study ---------------------------------------------------------------------------------
# A small synthetic study stored the way the search stores one, without running any engine: for
# the tests of the report, its figures and the sweep of a study. The numbers are made up but shaped
# like CPU trials of the tiny model: the attrs keys, the constraint, the parameters, the metric
# names and the verified best match the search's.

DEMO_TRACES = ("short", "long_prompt", "batched")
# Relative speed and memory of each choice (the shape of a real CPU study, not a measurement).
DEMO_SPEED = {
    "cache": {"contiguous": 0.8, "slab": 1.0, "paged": 0.9},
    "attention": {"manual": 0.7, "sdpa": 1.0},
    "fuse_qkv": {True: 1.05, False: 1.0},
    "fuse_gate_up": {True: 1.03, False: 1.0},
}
DEMO_MEMORY = {"contiguous": 1.6, "slab": 1.0, "paged": 0.7}


def _demo_attrs(variant, rng, ok: bool) -> tuple[dict, tuple]:
    from search.trial import geometric_mean

    v = variant.to_dict()
    attrs: dict = {
        "variant": v,
        "variant_name": variant.name,
        "status": "ok" if ok else "infeasible",
        "protocol": "quick",
        "atol": 0.01,
        "rtol": 0.01,
        "max_abs_err": 3e-4 if ok else 0.4,
        "tol_share": 0.03 if ok else 40.0,
        "constraint": [0.03 - 0.5 if ok else 40.0 - 0.5],
        "trial_seconds": round(rng.uniform(8, 20), 3),
    }
    if not ok:
        attrs["reason"] = "wrong logits: uses 40.00 of the tolerance (limit 0.5)"
        return attrs, (0.0, 0.0)
    speed = 1.0
    for axis, table in DEMO_SPEED.items():
        speed *= table[v[axis]]
    tps = {}
    for i, trace in enumerate(DEMO_TRACES):
        tps[trace] = (400.0 + 300 * i) * speed * rng.uniform(0.92, 1.08)
        attrs[f"tps_{trace}"] = tps[trace]
        attrs[f"decode_tps_{trace}"] = tps[trace] * 0.8
        attrs[f"seconds_{trace}"] = 64 / tps[trace]
        attrs[f"floor_eff_{trace}"] = min(0.95, 0.05 * speed * (i + 1) * rng.uniform(0.9, 1.1))
    attrs["tokens_per_s"] = geometric_mean(list(tps.values()))
    attrs["peak_mib"] = 40.0 * DEMO_MEMORY[v["cache"]] * rng.uniform(0.97, 1.03)
    attrs["create_s"] = 0.2
    attrs["peak_kind"] = "rss"
    return attrs, (attrs["tokens_per_s"], attrs["peak_mib"])


def create_demo_study(url: str, name: str = "demo", seed: int = 0):
    """A study of 24 trials (two infeasible, one failed) with a verified best, at `url`."""
    import itertools
    import random

    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState

    from search import study as st
    from variants.variant import Variant

    rng = random.Random(seed)
    study = st.open_study(st.open_storage(url), name, fresh=True)
    dists = {
        "cache": CategoricalDistribution(["contiguous", "slab", "paged"]),
        "attention": CategoricalDistribution(["manual", "sdpa"]),
        "fuse_qkv": CategoricalDistribution([True, False]),
        "fuse_gate_up": CategoricalDistribution([True, False]),
    }
    variants = [
        Variant(cache=cache, attention=attention, fuse_qkv=qkv, fuse_gate_up=gate_up)
        for cache, attention, qkv, gate_up in itertools.product(
            ("contiguous", "slab", "paged"), ("manual", "sdpa"), (True, False), (True, False)
        )
    ]
    rng.shuffle(variants)
    for number, variant in enumerate(variants):
        params = {k: getattr(variant, k) for k in dists}
        if number == 5:
            attrs = {
                "variant": variant.to_dict(),
                "variant_name": variant.name,
                "status": "failed",
                "reason": "timed out after 180 s during timing",
                "timed_out": True,
                "constraint": [1e6],
            }
            trial = optuna.trial.create_trial(
                state=TrialState.FAIL, params=params, distributions=dists, user_attrs=attrs
            )
        else:
            ok = not (
                variant.attention == "manual" and variant.cache == "contiguous" and number % 2
            )
            attrs, values = _demo_attrs(variant, rng, ok)
            trial = optuna.trial.create_trial(
                state=TrialState.COMPLETE,
                params=params,
                distributions=dists,
                values=list(values),
                user_attrs=attrs,
            )
        study.add_trial(trial)
    study.set_user_attr("traces", list(DEMO_TRACES))
    study.set_user_attr("hardware", "cpu-demo")
    best = max(
        (t for t in study.get_trials() if t.user_attrs.get("status") == "ok"),
        key=lambda t: t.values[0],
    )
    study.set_user_attr(
        "verified_best",
        {
            "trial": best.number,
            "variant": best.user_attrs["variant"],
            "variant_name": best.user_attrs["variant_name"],
            "tokens_per_s": best.values[0],
            "peak_mib": best.values[1],
            "n_trials": len(study.get_trials()),
            "engine_sha256": "0" * 64,
            "verified_at": "2026-01-01 00:00:00",
        },
    )
    return study


@pytest.fixture(scope="session")
def demo_study():
    """`create_demo_study(url, name="demo", seed=0)`: a synthetic study stored at `url`."""
    return create_demo_study


# --- the processes below a search process in /proc: its trials and their forkserver -----------


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # the parent's pid
            found.append(int(stat.parent.name))
    return found


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        below = _children(todo.pop())
        found += below
        todo += below
    return found


def _trial_logs(pid: int) -> dict[int, Path]:
    """The trial processes below `pid`: those whose output goes to a trial folder's log.txt."""
    logs = {}
    for child in _descendants(pid):
        try:
            out = Path(os.readlink(f"/proc/{child}/fd/1"))
        except OSError:
            continue
        if out.name == "log.txt" and out.parent.name.startswith("trial-"):
            logs[child] = out
    return logs


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.fixture
def processes():
    """`alive(pid)`, `descendants(pid)`, `trial_logs(pid)` (Linux's /proc)."""
    from types import SimpleNamespace

    return SimpleNamespace(alive=_alive, descendants=_descendants, trial_logs=_trial_logs)
