"""scripts/course_grader.py: a mistake in its command line is one line and exit 2, before it
runs either of the course's scripts or writes anything."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "course_grader.py"


@pytest.fixture
def skeleton(tmp_path):
    evaluator = tmp_path / "stage3" / "evaluator"
    evaluator.mkdir(parents=True)
    for name in ("test_correctness.py", "benchmark_throughput.py"):
        # a script that ran would leave this file behind
        (evaluator / name).write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    return tmp_path / "stage3"


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--bogus"], "the following arguments are required"),
        (["--engine", "{engine}", "--skeleton", "{tmp}"], "not a stage3 skeleton"),
        (["--engine", "{tmp}/none.py"], "--engine {tmp}/none.py: no such file"),
        (["--engine", "{engine}", "--memory-cap-gib", "nan"], "--memory-cap-gib must be"),
        (["--engine", "{engine}", "--memory-cap-gib", "-1"], "--memory-cap-gib must be"),
        (["--engine", "{engine}", "--memory-cap-gib", "lots"], "invalid float value: 'lots'"),
        (["--engine", "{engine}", "--timeout", "0"], "--timeout must be"),
        (["--engine", "{engine}", "--json", "{tmp}/no/such/out.json"], "its folder does not"),
    ],
)
def test_a_mistake_is_one_line_and_runs_nothing(skeleton, tmp_path, flags, said):
    engine = tmp_path / "engine.py"
    engine.write_text("def create_engine(model_config, weight_dir, device): ...\n")
    values = {"engine": str(engine), "tmp": str(tmp_path)}
    args = ["--skeleton", str(skeleton)] + [f.format(**values) for f in flags]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert said.format(**values) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine.py", "stage3"]
