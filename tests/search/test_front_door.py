"""The front door: every user mistake is one line naming the problem and the fix, exit 2, within
seconds, with nothing written; studies are found (or listed) without creating any."""

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from evaluator.toy_weights import make_toy_weights
from search.write import (
    FINGERPRINT,
    common_failure,
    engine_fingerprint,
    model_fingerprint,
    set_aside,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def model(tiny_config, tmp_path):
    """A user's model folder (the course's format)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model_config.json").write_text(json.dumps(tiny_config))
    torch.save(make_toy_weights(tiny_config), folder / "model.pt")
    return folder


def _run(search_cli, tmp_path, *args):
    ws, studies = tmp_path / "ws", tmp_path / "studies"
    start = time.monotonic()
    proc = search_cli(["run", "--workspace", str(ws), "--studies-dir", str(studies), *args])
    return proc, time.monotonic() - start, ws, studies


def _bad_weights(folder, tiny_config):
    state = make_toy_weights(tiny_config)
    del state["layers.1.self_attn.k_proj.weight"]
    torch.save(state, folder / "model.pt")


@pytest.mark.parametrize(
    "case, message",
    [
        ("bad-json", "is not valid JSON"),
        ("no-config", "cannot read model config"),
        ("no-weights", "no weights in"),
        ("missing-key", "weight 'layers.1.self_attn.k_proj.weight' is missing"),
        ("heads", "is not a multiple of num_key_value_heads 3; fix the config"),
        ("device-gpu", "--device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
        ("budget", "--memory-budget-gib must be a number > 0, got 0.0"),
        ("budget-nan", "--budget-minutes must be a number > 0, got nan"),
        ("trials", "--trials must be a number >= 1, got 0"),
        ("weights-too-big", "leaves each of the grader's 3 live engines 0.000333 GiB, less than"),
        ("not-a-number", "argument --budget-minutes: invalid float value: 'abc'; see `python -m"),
        ("abbreviated", "unrecognized arguments: --budget-minute 2; see `python -m search --help`"),
        ("storage-scheme", "cannot open the storage foo://x (Can't load plugin: sqlalchemy"),
        ("storage-folder", "unable to open database file); give sqlite:///PATH.db"),
        ("study-path", "--study '../escape': a study stored in the studies folder is named by"),
        ("empty-config", "--model-config is empty (an unset shell variable?)"),
        ("weights-file", "is a file: pass its folder"),
        ("cpu-index", "--device cpu:0: the CPU takes no index; use --device cpu"),
        ("traces", "--traces: unknown trace 'bogus'; known: public_correctness, stress"),
        ("renderer", "--renderer nosuch:fn: ModuleNotFoundError"),
        ("eps", "rms_norm_eps must be a positive number, got -1; fix the config"),
        ("size-string", "head_dim must be a whole number, got '24'; fix the config"),
        ("truncated", "(PytorchStreamReader failed reading zip archive: failed finding central"),
    ],
)
def test_a_users_mistake_is_one_line_exit_2_and_nothing_written(
    case, message, model, tiny_config, tmp_path, search_cli
):
    config, weights, extra = model / "model_config.json", model, []
    if case == "bad-json":
        config.write_text("{bad json")
    elif case == "no-config":
        config = model / "missing.json"
    elif case == "no-weights":
        weights = tmp_path / "empty"
        weights.mkdir()
    elif case == "missing-key":
        _bad_weights(model, tiny_config)
    elif case == "heads":
        config.write_text(json.dumps({**tiny_config, "num_key_value_heads": 3}))
    elif case == "device-gpu":
        extra = ["--device", "gpu"]
    elif case == "eps":
        config.write_text(json.dumps({**tiny_config, "rms_norm_eps": -1}))
    elif case == "size-string":
        config.write_text(json.dumps({**tiny_config, "head_dim": "24"}))
    elif case == "truncated":
        data = (model / "model.pt").read_bytes()
        (model / "model.pt").write_bytes(data[: len(data) // 2])
    elif case == "empty-config":
        config = ""
    elif case == "weights-file":
        weights = model / "model.pt"
    else:
        extra = {
            "budget": ["--memory-budget-gib", "0"],
            "budget-nan": ["--budget-minutes", "nan"],
            "trials": ["--trials", "0"],
            "weights-too-big": ["--memory-budget-gib", "0.001"],
            "not-a-number": ["--budget-minutes", "abc"],
            "abbreviated": ["--budget-minute", "2"],  # argparse would take --budget-minutes
            "storage-scheme": ["--storage", "foo://x"],
            "storage-folder": ["--storage", f"sqlite:///{tmp_path}/none/x.db"],
            "study-path": ["--study", "../escape"],
            "cpu-index": ["--device", "cpu:0"],
            "traces": ["--traces", "prefill,bogus"],
            "renderer": ["--renderer", "nosuch:fn"],
        }[case]
    before = {p: p.stat().st_mtime_ns for p in model.iterdir()}
    args = ["--model-config", str(config), "--weight-dir", str(weights), "--device", "cpu", *extra]
    proc, seconds, ws, studies = _run(search_cli, tmp_path, *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and message in lines[-1], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert seconds < 30
    assert not ws.exists() and not studies.exists() and not (tmp_path / "none").exists()
    assert not (REPO_ROOT / "escape.db").exists()
    assert {p: p.stat().st_mtime_ns for p in model.iterdir()} == before
    if case == "no-weights":
        assert list(weights.iterdir()) == []


def test_debug_shows_the_traceback(model, tmp_path, search_cli):
    (model / "model_config.json").write_text("{bad json")
    args = ["--model-config", str(model / "model_config.json"), "--device", "cpu", "--debug"]
    proc, _, _, _ = _run(search_cli, tmp_path, *args)
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_run_sh_says_the_same_in_one_line(model, tmp_path, child_env):
    import subprocess

    (model / "model_config.json").write_text("{bad json")
    proc = subprocess.run(
        ["bash", "run.sh", "--model-config", str(model / "model_config.json"), "--device", "cpu"],
        cwd=REPO_ROOT, env=child_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: model config")


def test_run_sh_guesses_no_flag(tmp_path, child_env):
    """`--budget-minute 2` is refused in one line, not run as --budget-minutes 2 (which wrote
    over workspace/engine.py)."""
    import subprocess

    ws = tmp_path / "ws"
    proc = subprocess.run(
        ["bash", "run.sh", "--budget-minute", "2", "--workspace", str(ws)],
        cwd=REPO_ROOT, env=child_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and not ws.exists()
    assert proc.stderr == (
        "error: unrecognized arguments: --budget-minute 2; see `python -m search --help`\n"
    )


@pytest.mark.parametrize("command", ["report", "render"])
def test_report_and_render_list_the_studies_and_create_nothing(command, tmp_path, search_cli):
    studies = tmp_path / "studies"
    args = [command, "--studies-dir", str(studies)]
    args += ["--output", str(tmp_path / "e.py")] if command == "render" else []
    proc = search_cli([*args, "--study", "nope"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no study 'nope' in" in proc.stderr and "studies there: none" in proc.stderr
    proc = search_cli(args)  # nothing run yet: says what to run
    assert proc.returncode == 2 and "no study in" in proc.stderr and "bash run.sh" in proc.stderr
    assert not studies.exists() and not (REPO_ROOT / "studies" / "nope.db").exists()


def test_set_aside_keeps_an_engine_of_this_model_and_moves_another(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    engine = ws / "engine.py"
    job = SimpleNamespace(workspace=ws, target=SimpleNamespace(fingerprint="abc", config={"a": 1}))
    ours = model_fingerprint(job.target)
    engine.write_text(f"x = 1\n\n# {FINGERPRINT}{ours}\n")
    assert engine_fingerprint(engine) == ours and ours.startswith("abc-c")
    assert "stays in place" in set_aside(job) and engine.is_file()
    other_config = model_fingerprint(SimpleNamespace(fingerprint="abc", config={"a": 2}))
    engine.write_text(f"x = 1\n\n# {FINGERPRINT}{other_config}\n")  # these weights, not it
    assert "moved to engine.stale.py" in set_aside(job)
    assert not engine.exists() and (ws / "engine.stale.py").is_file()
    assert set_aside(job) == "no engine.py is in place"


def test_the_last_line_names_the_most_common_cause():
    from search.trial import Record

    records = [
        Record(0, "failed", {}, {"reason": "KeyError: 'x'\ntraceback..."}),
        Record(1, "failed", {}, {"reason": "KeyError: 'x'"}),
        Record(2, "infeasible", {}, {"reason": "uses 0.7 of the tolerance"}),
        Record(3, "ok", {}, {}),
    ]
    assert common_failure(records, []) == "KeyError: 'x' (2 of 3)"
    assert common_failure([], []) == "no trial ran"


def test_a_written_engine_is_readable_by_all(tmp_path):
    from variants.render import render_engine
    from variants.variant import Variant

    path = render_engine(Variant(), tmp_path / "engine.py", f"{FINGERPRINT}abc")
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert engine_fingerprint(path) == "abc"


def _record(number, screening, full=None, **extra):
    from search.trial import Record

    attrs = {"variant_name": f"v{number}", "tokens_per_s": screening, "peak_mib": 100.0}
    attrs |= {"constraint": [-0.1], "max_abs_err": 0.001, "tol_share": 0.1, **extra}
    if full is not None:
        attrs |= {"full_tokens_per_s": full, "full_peak_mib": 120.0}
    return Record(number, "ok", {"block_size": number}, attrs, (screening, 100.0))


def test_the_log_compares_the_chosen_and_the_runner_up_on_one_protocol():
    """A chosen engine with full-protocol numbers against a runner-up without: both by their
    screening numbers, never 6,991 (full) against 59,000 (screening)."""
    from search.report import RANKING, _why
    from search.write import rank

    chosen, runner_up = _record(1, 80_033.0, full=6_991.0), _record(2, 59_000.0)
    ranked = rank([chosen, runner_up])
    assert [r.number for r in ranked] == [1, 2]  # re-measured leaders first
    text = _why(chosen, ranked)
    assert "59000.0 against 80033.0 tokens/s (screening, both)" in text
    assert "1.356x its throughput" in text and RANKING in text
    both = _why(chosen, rank([chosen, _record(3, 50_000.0, full=7_500.0)]))
    assert "against 6991.0 tokens/s (full protocol, both)" in both
    # the chosen line says where its figures come from: the grader's protocol, or screening
    assert text.startswith(
        "v1 (trial 1): 6991.0 tokens/s (geometric mean, full protocol: the grader's pattern, a "
        "fresh engine for each of three repeats; screening had 80033.0), peak 120 MiB"
    )
    assert "80033.0 tokens/s (geometric mean, screening on one engine; not re-measured" in _why(
        _record(1, 80_033.0), []
    )


def test_the_chosen_line_gives_the_share_of_the_gate_that_judged_it():
    """The noise gate's share where it judged (not the course tolerance's, which it ignores)."""
    from search.report import _why

    assert "max error 0.001 (0.10 of the tolerance)." in _why(_record(1, 100.0), [])
    noise = _why(_record(1, 100.0, gate="noise", noise_share=0.59), [])
    assert "max error 0.001 (0.59 of the noise gate's limit)." in noise


def test_the_top_table_keeps_screening_and_full_numbers_apart():
    from search.report import top_table

    header, _, first = top_table([_record(1, 80_033.0, full=6_991.0)]).splitlines()[:3]
    assert "screening tok/s" in header and "full tok/s" in header
    assert "80,033" in first and "6991.0" in first


def test_a_wrong_engine_is_on_no_pareto_front(tiny_config):
    """Infeasible trials are told (0 tokens/s, infinite memory): the dashboard's front, which
    ignores constraints, does not list them."""
    from search.trial import TrialRunner, outcome_from_result

    runner = TrialRunner(tiny_config, "/nowhere", "cpu")
    from variants.variant import Variant

    wrong = {"status": "infeasible", "reason": "wrong", "tol_share": 3.0, "max_abs_err": 0.1}
    outcome = outcome_from_result(wrong, Variant(), runner, "quick")
    assert outcome.values == (0.0, float("inf")) and outcome.constraint > 0


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    from search import cli

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.RunJob, "run", interrupted)
    assert cli.main(["run", "--device", "cpu"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["render", "--output", "{user_file}"], "exists and is not an engine file: give a new"),
        (["render", "--output", "{tmp}"], "is a folder: give a file path"),
        (["render", "--output", "/proc/x/engine.py"], "cannot write in /proc ("),
        (["report", "--out", "{user_file}"], "is a file: give a folder path"),
        (["report", "--top", "0"], "--top must be a number >= 1, got 0"),
        (["report", "--sweep", "{tmp}/none.json"], "no such file; give the JSON"),
        (["sweep", "--variant", "safest", "--time-limit", "-5"], "--time-limit must be a number >"),
        (["sweep", "--variant", "safest", "--out", "{tmp}"], "is a folder: give a file path"),
        (["worker", "--storage", "{tmp}/none.journal", "--study", "s"], "no storage at "),
    ],
)  # fmt: skip
def test_an_output_or_a_number_a_command_cannot_use_is_one_line(
    args, message, tmp_path, search_cli
):
    user_file = tmp_path / "notes.txt"
    user_file.write_text("a user's file\n")
    names = {"tmp": str(tmp_path), "user_file": str(user_file)}
    studies = tmp_path / "studies"
    proc = search_cli([*(a.format(**names) for a in args), "--studies-dir", str(studies)])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert message.format(**names) in proc.stderr
    assert user_file.read_text() == "a user's file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # nothing else written
