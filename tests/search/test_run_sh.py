"""`bash run.sh` end to end with the real renderer: the written engine passes the evaluator."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_CONFIG = REPO_ROOT / "tests" / "data" / "tiny_config.json"


def test_run_sh_help_lists_the_options():
    out = subprocess.run(
        ["bash", "run.sh", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0
    for option in ("--model-config", "--weight-dir", "--device", "--budget-minutes", "--trials",
                   "--storage", "--study", "--fresh"):  # fmt: skip
        assert option in out.stdout, option


def test_run_sh_writes_a_verified_engine(tmp_path, tiny_weights, child_env, fresh_check):
    pytest.importorskip("variants.render")
    workspace = tmp_path / "ws"
    cmd = ["bash", "run.sh", "--model-config", str(TINY_CONFIG), "--weight-dir", tiny_weights]
    cmd += ["--device", "cpu", "--trials", "1", "--budget-minutes", "3"]
    # Keep the repository's workspace/ and studies/ out of the test.
    cmd += ["--workspace", str(workspace), "--storage", f"sqlite:///{tmp_path}/e2e.db"]
    proc = subprocess.run(
        cmd, cwd=REPO_ROOT, env=child_env, capture_output=True, text=True, timeout=420
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = (workspace / "results.log").read_text()
    assert "== chosen ==" in log and "NONE:" not in log
    assert "memory budget" in log and "grader's pattern" in log
    engine = workspace / "engine.py"
    assert "MEMORY_BUDGET_GIB = " in engine.read_text()
    # its weights are a course-layout model.pt: it carries that reader alone
    assert "def read_checkpoint" not in engine.read_text()
    check = fresh_check(engine, TINY_CONFIG, tiny_weights)
    assert check.returncode == 0, check.stdout + check.stderr
    assert '"passed": true' in check.stdout and '"stress"' in check.stdout
    # our benchmark in the grader's pattern: a warm-up engine and a fresh one per repeat by
    # assignment, nothing collected (evaluator/benchmark.py)
    report = tmp_path / "bench.json"
    bench = ["evaluator/benchmark_throughput.py", "--engine", str(engine), "--device", "cpu"]
    bench += ["--model-config", str(TINY_CONFIG), "--weight-dir", tiny_weights]
    bench += ["--warmup", "0", "--repeat", "2", "--json", str(report)]
    proc = subprocess.run(
        [sys.executable, *bench], cwd=REPO_ROOT, env=child_env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    traces = json.loads(report.read_text())["traces"]
    assert set(traces) == {"prefill", "decode", "mixed"}
    for t in traces.values():
        assert t["pattern"] == "grader" and t["engines_built"] == 3 and t["peak_mib"] > 0
