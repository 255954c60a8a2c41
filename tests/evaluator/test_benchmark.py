"""time_trace times like the grader: fresh engines, untimed construction, token counts."""

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from evaluator import benchmark_throughput as cli
from evaluator.benchmark import time_trace
from evaluator.engine_loader import load_engine_module
from evaluator.traces import Decode, Prefill, Remove, Trace

ENGINES = Path(__file__).parent / "engines"
REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_PATH = REPO_ROOT / "tests" / "data" / "tiny_config.json"
SMALL = Trace("small", (Prefill([3, 1], [5, 9]), Decode([1, 3]), Decode([3]), Remove([1, 3])))


class CountingFactory:
    """create_engine that counts its calls and records whether prefill ran without grad."""

    def __init__(self):
        self.make = load_engine_module(ENGINES / "reference_engine.py").create_engine
        self.calls, self.grad_seen = 0, []

    def __call__(self, config, weight_dir, device):
        self.calls += 1
        engine = self.make(config, weight_dir, device)
        prefill = engine.prefill

        def recording_prefill(ids, tokens):
            self.grad_seen.append(torch.is_grad_enabled())
            return prefill(ids, tokens)

        engine.prefill = recording_prefill
        return engine


@pytest.mark.parametrize("fresh, repeat, built", [(True, 3, 4), (True, 2, 3), (False, 3, 1)])
def test_time_trace_counts_engines_and_tokens(tiny_config, tiny_weights, fresh, repeat, built):
    factory = CountingFactory()
    result = time_trace(
        factory, tiny_config, tiny_weights, "cpu", SMALL, repeat=repeat, fresh_engine=fresh
    )
    assert factory.calls == built and result["engines_built"] == built
    assert factory.grad_seen == [False] * (1 + repeat)  # warm-up run + each repeat
    assert result["trace"] == "small"
    assert (result["prefill_tokens"], result["decode_tokens"]) == (14, 3)
    assert len(result["all_seconds"]) == repeat
    assert all(s > 0 and math.isfinite(s) for s in result["all_seconds"])
    assert result["seconds"] == statistics.median(result["all_seconds"])
    assert result["tokens_per_s"] == pytest.approx(17 / result["seconds"])
    assert result["decode_tokens_per_s"] == pytest.approx(3 / result["seconds"])
    assert result["peak_mib"] > 0 and result["peak_kind"] == "process_max_rss"


class SlowToBuild:
    """Takes 0.5 s to build and almost nothing to run."""

    def __init__(self, config, weight_dir, device):
        time.sleep(0.5)
        self.vocab = config["vocab_size"]

    def prefill(self, ids, tokens):
        return torch.zeros(len(ids), self.vocab)

    def decode(self, ids, tokens):
        return torch.zeros(len(ids), self.vocab)

    def remove(self, ids):
        pass


def test_create_engine_is_not_timed(tiny_config, tiny_weights):
    result = time_trace(SlowToBuild, tiny_config, tiny_weights, "cpu", SMALL, warmup=0, repeat=1)
    assert result["create_s"] >= 0.5
    assert result["seconds"] < 0.25


def test_benchmark_cli_reports_every_trace(tiny_weights, capsys):
    args = ["--engine", str(ENGINES / "reference_engine.py"), "--model-config", str(CONFIG_PATH)]
    args += ["--weight-dir", tiny_weights, "--device", "cpu", "--suite", "public"]
    args += ["--warmup", "0", "--repeat", "1", "--bandwidth-gbs", "100", "--tflops", "1"]
    assert cli.main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ceilings"] == {"bandwidth_gbs": 100.0, "tflops": 1.0, "source": "given"}
    assert list(report["traces"]) == ["prefill", "decode", "mixed"]
    for row in report["traces"].values():
        assert row["tokens_per_s"] > 0 and row["create_s"] > 0
        if row["floor_efficiency"] is not None:  # (None: the CPU's ceilings measured too low)
            assert 0 < row["floor_efficiency"] <= 1
            assert row["floor_efficiency"] == pytest.approx(row["floor_s"] / row["seconds"])
    assert report["traces"]["decode"]["decode_tokens"] == 128


def test_benchmark_cli_rejects_a_missing_engine_as_a_file(tmp_path):
    run = subprocess.run(
        [sys.executable, "evaluator/benchmark_throughput.py", "--engine", str(tmp_path / "x.py")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert run.stderr.startswith("error: engine file not found") and run.stderr.count("\n") == 1


def test_benchmark_cli_says_a_failing_engine_and_bad_flags_in_one_line(
    tiny_weights, tmp_path, capsys
):
    engine = tmp_path / "raises.py"
    engine.write_text("def create_engine(c, w, d):\n    raise RuntimeError('boom')\n")
    args = ["--engine", str(engine), "--device", "cpu", "--suite", "public"]
    args += ["--model-config", str(CONFIG_PATH), "--weight-dir", tiny_weights]
    assert cli.main(args) == 1  # the engine's fault: a result, not a user error
    err = capsys.readouterr().err
    assert err == "FAILED trace prefill: RuntimeError: boom\n"
    assert cli.main([*args, "--bandwidth-gbs", "0"]) == 2
    assert capsys.readouterr().err == "error: --bandwidth-gbs must be > 0, got 0.0\n"


HEAVY = """
import json, sys
import torch
from evaluator.benchmark import time_trace
from evaluator.traces import Decode, Prefill, Remove, Trace

class Heavy:
    # holds 64 MiB of host memory (every page touched); a cyclic one also holds itself, so
    # only the cyclic collector (which the grader never runs) frees it
    cyclic = sys.argv[1] == "cyclic"

    def __init__(self, config, weight_dir, device):
        self.block = torch.ones(16 * 2**20)
        self.vocab = config["vocab_size"]
        if self.cyclic:
            self.me = self

    def prefill(self, ids, tokens):
        return torch.zeros(len(ids), self.vocab)

    decode = prefill

    def remove(self, ids):
        pass

trace = Trace("small", (Prefill([3, 1], [5, 9]), Decode([1, 3]), Remove([1, 3])))
config = {"vocab_size": 8}
print(json.dumps(time_trace(Heavy, config, "-", "cpu", trace, repeat=4)["peak_mib"]))
"""


def test_the_grader_pattern_keeps_what_a_cycle_holds():
    """A warm-up engine and a fresh engine per repeat by assignment, nothing collected (each
    measured in a fresh process): engines freed by reference counting peak at three alive
    (warm-up, last, new), cyclic ones at all five."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    peaks = {}
    for kind in ("plain", "cyclic"):
        out = subprocess.run(
            [sys.executable, "-c", HEAVY, kind], cwd=REPO_ROOT, env=env,
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        peaks[kind] = json.loads(out.stdout)
    assert peaks["cyclic"] - peaks["plain"] > 1.5 * 64, peaks
