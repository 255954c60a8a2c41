"""The correctness gate: a correct engine passes, each planted fault fails in the right place."""

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from evaluator import test_correctness as cli
from evaluator.correctness import check_engine
from evaluator.correctness_traces import stress
from evaluator.engine_loader import load_engine_module
from evaluator.traces import Prefill, replay

ENGINES = Path(__file__).parent / "engines"
REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_PATH = REPO_ROOT / "tests" / "data" / "tiny_config.json"


def engine_factory(name: str):
    return load_engine_module(ENGINES / f"{name}.py").create_engine


def first_reprefill_step(config) -> int:
    live: set[int] = set()
    for step, (op, _) in enumerate(replay(stress(config, 0))):
        if isinstance(op, Prefill) and live & set(op.ids):
            return step
        live = live - set(op.ids) if type(op).__name__ == "Remove" else live | set(op.ids)
    raise AssertionError("stress has no re-prefill")


@pytest.mark.parametrize(
    "weights, cases", [("tiny_weights", ("public",)), ("sharp_weights", ("public", "stress"))]
)
def test_reference_engine_passes_public_and_stress(tiny_config, weights, cases, request):
    weight_dir = request.getfixturevalue(weights)
    results = check_engine(
        engine_factory("reference_engine"), tiny_config, weight_dir, "cpu", cases=cases
    )
    assert list(results) == list(cases)
    assert results["public"]["steps"] == 6
    if "stress" in cases:
        checked = sum(type(op).__name__ != "Remove" for op in stress(tiny_config, 0).ops)
        assert results["stress"]["steps"] == checked
    for case in cases:
        assert results[case]["passed"] and results[case]["failure"] is None
        # The same reference, recomputed: nothing but identical arithmetic.
        assert results[case]["tol_share"] < 1e-3
        assert results[case]["max_abs_err"] < 1e-5


@pytest.mark.parametrize(
    "name, failing, where",
    [
        ("rope_rotate_half_engine", ("public", "stress"), "step 0 (prefill"),
        ("padded_last_token_engine", ("public", "stress"), "(prefill"),
        ("wrong_remove_engine", ("public", "stress"), "(decode"),
        ("aliased_output_engine", ("public", "stress"), "changed after step 1"),
        ("reprefill_appends_engine", ("stress",), None),
    ],
)
def test_planted_faults_fail_in_the_named_case(tiny_config, sharp_weights, name, failing, where):
    results = check_engine(engine_factory(name), tiny_config, sharp_weights, "cpu")
    for case in ("public", "stress"):
        assert results[case]["passed"] == (case not in failing), (case, results[case])
    for case in failing:
        failure = results[case]["failure"]
        if name != "aliased_output_engine":
            assert results[case]["tol_share"] > 1.0
        expected = where or f"step {first_reprefill_step(tiny_config)} (prefill"
        assert expected in failure, failure
    if name == "padded_last_token_engine":
        assert results["public"]["failure"].startswith("step 2 (prefill ids=[1,2]")
    if name == "wrong_remove_engine":
        assert results["public"]["failure"].startswith("step 6 (decode ids=[0,2,3]")


class _Broken:
    """Wraps the reference engine and breaks its returned logits in one way."""

    def __init__(self, inner, breaks):
        self.inner, self.breaks = inner, breaks

    def prefill(self, ids, tokens):
        return self.breaks(self.inner.prefill(ids, tokens))

    def decode(self, ids, tokens):
        return self.breaks(self.inner.decode(ids, tokens))

    def remove(self, ids):
        self.inner.remove(ids)


def _explode(logits):
    raise RuntimeError("kernel launch failed")


@pytest.mark.parametrize(
    "breaks, message",
    [
        (lambda x: x.half(), "dtype torch.float16 != torch.float32"),
        (lambda x: x[:, :-1], "shape [1, 255] != [1, 256]"),
        (lambda x: x[0], "shape [256] != [1, 256]"),
        (lambda x: x.tolist(), "returned list, not a tensor"),
        (lambda x: x + 0.05, "step 0 (prefill ids=[0] (1)): request 0"),
        (_explode, "step 0 (prefill ids=[0] (1)): engine raised RuntimeError: kernel launch"),
    ],
)
def test_output_contract_checks(tiny_config, tiny_weights, breaks, message):
    make = engine_factory("reference_engine")
    create = lambda *args: _Broken(make(*args), breaks)
    result = check_engine(create, tiny_config, tiny_weights, "cpu", cases=("public",))["public"]
    assert not result["passed"] and message in result["failure"]


def test_tolerance_share_is_measured(tiny_config, tiny_weights):
    make = engine_factory("reference_engine")
    create = lambda *args: _Broken(make(*args), lambda x: x + 0.005)
    result = check_engine(create, tiny_config, tiny_weights, "cpu", cases=("public",))["public"]
    # |d| = 0.005 against atol + rtol * |ref| >= 0.01: passes, using at most half the tolerance.
    assert result["passed"]
    assert result["max_abs_err"] == pytest.approx(0.005, rel=1e-3)
    assert 0.3 < result["tol_share"] <= 0.5 + 1e-4


def test_cli_runs_as_a_file(tiny_weights, tmp_path):
    out = tmp_path / "report.json"
    args = [sys.executable, "evaluator/test_correctness.py", "--model-config", str(CONFIG_PATH)]
    args += ["--weight-dir", tiny_weights, "--device", "cpu", "--json", str(out)]
    ok = subprocess.run(
        [*args, "--engine", str(ENGINES / "reference_engine.py")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert list(report["cases"]) == ["public"] and report["cases"]["public"]["passed"]
    assert json.loads(out.read_text()) == report


def test_cli_fails_naming_the_case(tiny_weights, capsys):
    args = ["--model-config", str(CONFIG_PATH), "--weight-dir", tiny_weights, "--device", "cpu"]
    args += ["--engine", str(ENGINES / "reprefill_appends_engine.py"), "--stress"]
    assert cli.main(args) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["cases"]["public"]["passed"] and not report["cases"]["stress"]["passed"]
    assert captured.err.startswith("FAILED case stress: step ")


@pytest.mark.parametrize(
    "engine_text, config_text, message",
    [
        (None, None, "engine file not found"),
        ("x = 1\n", None, "defines no create_engine"),
        ("import nonexistent_module_xyz\n", None, "ModuleNotFoundError"),
        ("def create_engine(c, w, d):\n    pass\n", "{not json", "not valid JSON"),
        ("def create_engine(c, w, d):\n    pass\n", '{"vocab_size": 8}', "missing or invalid"),
    ],
)
def test_cli_rejects_bad_input(tiny_weights, tmp_path, capsys, engine_text, config_text, message):
    engine = tmp_path / "engine.py"
    if engine_text is not None:
        engine.write_text(engine_text)
    config = CONFIG_PATH
    if config_text is not None:
        config = tmp_path / "config.json"
        config.write_text(config_text)
    args = ["--engine", str(engine), "--model-config", str(config), "--weight-dir", tiny_weights]
    assert cli.main([*args, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--atol", "-1"], "--atol must be >= 0, got -1.0"),
        (["--rtol", "nan"], "--rtol must be >= 0, got nan"),
        (["--stress", "--stress-positions", "0"], "--stress-positions must be >= 16, got 0"),
        (["--json", "{tmp}/none/report.json"], "give a file path in a folder that exists"),
        (["--json", "{tmp}"], "give a file path in a folder that exists"),
        (["--device", "bogus"], "--device must be cpu, cuda or cuda:N, got 'bogus'"),
        (["--cases", "public", "--bogus"], "unrecognized arguments: --bogus; see `"),
    ],
)
def test_cli_rejects_bad_flags_before_running(tiny_weights, tmp_path, capsys, flags, message):
    args = ["--engine", str(ENGINES / "reprefill_appends_engine.py"), "--weight-dir", tiny_weights]
    args += ["--model-config", str(CONFIG_PATH), "--device", "cpu"]
    with pytest.raises(SystemExit) if "--bogus" in flags else contextlib.nullcontext():
        assert cli.main([*args, *(f.format(tmp=tmp_path) for f in flags)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("error: ") and message in captured.err
    assert list(tmp_path.iterdir()) == []
