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
