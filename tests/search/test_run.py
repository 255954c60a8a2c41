"""The main job end to end with planted faults, resuming, and the offline fallback.

Engines come from `fake_render.py`: the reference model recomputing histories, with a crash, a
hang, wrong logits and a too-close answer planted by variant value. Each test runs
`python -m search run` in a child process, like `run.sh` does.
"""

import json
import re
import shutil
import time

import optuna
import pytest

from search import study as st
from search.setup import SearchSpace
from variants.presets import PRESETS
from variants.probe import probe_capabilities
from variants.variant import Variant

optuna.logging.set_verbosity(optuna.logging.WARNING)

PLANTED = {
    # correct, 2.25x slower; queued first, so no faster trial can have it pruned (timings on a
    # busy CI machine swing past the pruning bar)
    "safest": PRESETS["safest"],
    "fast": Variant(cache="slab", attention="sdpa"),  # correct, no delay: must win
    "crash": Variant(cache="contiguous", attention="sdpa"),
    "hang": Variant(cache="paged", block_size=256, attention="sdpa"),
    "wrong": Variant(cache="slab", attention="manual", fuse_qkv=True),
    "too_close": Variant(cache="paged", block_size=128, attention="sdpa"),
}
TRIAL_TIMEOUT = "15"


@pytest.fixture(scope="module")
def planted(
    tmp_path_factory, micro_config_path, tiny_config, tiny_weights, fake_renderer, search_cli
):
    tmp = tmp_path_factory.mktemp("planted")
    storage = f"sqlite:///{tmp}/planted.db"
    caps = probe_capabilities("cpu", tiny_config)
    space = SearchSpace(caps)
    study = st.open_study(st.open_storage(storage), "planted")
    for source, variant in PLANTED.items():
        study.enqueue_trial(
            space.params_for(space.canonical(variant)), user_attrs={"source": source}
        )
    args = [
        "run", "--model-config", str(micro_config_path), "--weight-dir", tiny_weights,
        "--device", "cpu", "--storage", storage, "--study", "planted", "--trials", "6",
        "--trial-timeout", TRIAL_TIMEOUT, "--budget-minutes", "8", "--remeasure", "1",
        "--traces", "decode", "--renderer", fake_renderer, "--workspace", str(tmp / "ws"),
        "--seed", "0", "--gate", "course",
    ]  # fmt: skip
    start = time.monotonic()
    proc = search_cli(args)
    seconds = time.monotonic() - start
    return {"tmp": tmp, "storage": storage, "args": args, "proc": proc, "seconds": seconds}


def by_source(storage: str) -> dict:
    study = st.load_study(st.open_storage(storage), "planted")
    return {t.user_attrs["source"]: t for t in study.get_trials()}


def test_planted_failures_are_recorded_and_the_engine_is_correct(planted):
    proc = planted["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = by_source(planted["storage"])
    assert len(trials) == 6
    status = {source: t.user_attrs["status"] for source, t in trials.items()}
    assert status == {
        "fast": "ok",
        "safest": "ok",
        "crash": "failed",
        "hang": "failed",
        "wrong": "infeasible",
        "too_close": "infeasible",
    }
    assert trials["crash"].state == optuna.trial.TrialState.FAIL
    assert "planted crash in create_engine" in trials["crash"].user_attrs["reason"]
    assert trials["hang"].user_attrs["reason"].startswith(f"timed out after {TRIAL_TIMEOUT} s")
    assert trials["hang"].user_attrs["timed_out"] is True
    assert trials["wrong"].user_attrs["tol_share"] > 1.0
    assert "the tolerance" in trials["wrong"].user_attrs["reason"]
    close = trials["too_close"].user_attrs
    assert 0.5 < close["tol_share"] < 1.0 and close["constraint"][0] > 0
    assert "of the tolerance (limit 0.5)" in close["reason"]
    fast, safest = trials["fast"].user_attrs, trials["safest"].user_attrs
    assert fast["tokens_per_s"] > safest["tokens_per_s"]
    assert fast["constraint"][0] <= 0 and set(fast["check"]) == {"public", "stress"}
    for key in ("tps_decode", "decode_tps_decode", "peak_mib", "create_s", "max_abs_err"):
        assert key in fast, key

    study = st.load_study(st.open_storage(planted["storage"]), "planted")
    best = study.user_attrs["verified_best"]
    assert best["variant"] == PLANTED["fast"].to_dict()
    full = study.user_attrs["full_protocol"]
    assert full[str(trials["fast"].number)]["full_tps_decode"] > 0
    # the verification's seconds, which the next run's budget reserves for it
    assert 0 < study.user_attrs["verify_seconds"] < planted["seconds"]

    # The pipeline verified the engine with the evaluator's CLI in a fresh process (the log
    # holds its output); test_run_sh.py checks a written engine independently once more.
    engine = planted["tmp"] / "ws" / "engine.py"
    assert f"Fake engine for {PLANTED['fast'].name}" in engine.read_text()
    log = (planted["tmp"] / "ws" / "results.log").read_text()
    assert f"trial {trials['fast'].number} {PLANTED['fast'].name}: PASSED" in log
    assert "stress: passed" in log
    assert "one pass with no warm-up" in log  # the verification's benchmark is no measurement
    assert "compiling the engine file's Triton kernels" not in log  # it has none


def test_verification_says_a_triton_engine_compiles_its_kernels(
    planted, micro_config_path, tiny_weights, tmp_path
):
    from search.write import verify_engine

    engine = tmp_path / "engine.py"
    text = (planted["tmp"] / "ws" / "engine.py").read_text()
    engine.write_text(text + "\n# as a rendered Triton engine reads: @triton.jit\n")
    done = verify_engine(engine, micro_config_path, tiny_weights, "cpu", 300, benchmark=False)
    assert done.passed
    assert "compiling the engine file's Triton kernels" in done.output


def test_results_log_names_every_trial_and_the_choice(planted):
    text = (planted["tmp"] / "ws" / "results.log").read_text()
    trials = by_source(planted["storage"])
    for trial in trials.values():
        assert f"#{trial.number:<3d}" in text
    chosen = text.split("== chosen ==")[1].split("==")[0]
    assert PLANTED["fast"].name in chosen and "Runner-up: " + PLANTED["safest"].name in chosen
    # the written engine's figures are the grader's protocol's, not one screening measurement
    assert "(geometric mean, full protocol: the grader's pattern" in chosen.splitlines()[1]
    for section in (
        "environment",
        "target",
        "search space",
        "top 5",
        "verification",
        "time per phase",
        "failure details",
    ):
        assert f"== {section}" in text, section
    assert "planted crash in create_engine" in text and "timed out after" in text
    every = st.load_study(st.open_storage(planted["storage"]), "planted").trials
    copies = sum(t.user_attrs.get("duplicate_of") is not None for t in every)
    copied = f": {copies} of them the sampler's copies, not run" if copies else ""
    assert f"== trials ({len(every)}{copied}) ==" in text
    assert "optuna-dashboard " + planted["storage"] in text
    assert "test_correctness.py: exit 0" in text
    phases = text.split("== time per phase ==")[1].split("==")[0]
    assert re.search(r"^start-up: \d+\.\d s$", phases, re.M), phases  # before the set-up
    # where a trial's time goes, phase by phase (the child's start-up, the gate, the timing)
    rate = next(line for line in text.splitlines() if line.startswith("a trial's time"))
    for phase in ("start-up", "render", "import", "reference", "correctness", "benchmark"):
        assert re.search(rf"\b{phase} \d+\.\d s", rate), (phase, rate)
    # The shape sweep of the correct variants, the chosen first, next to the study's report.
    report = planted["tmp"] / "planted"
    assert "shape sweep of 2 variant(s) (torch.compile variants left out on a CPU) (exit 0" in text
    assert "decode_vs_batch.png, prefill_vs_length.png" in text
    sweep = json.loads((report / "sweep.json").read_text())
    assert sweep["variants"][0]["variant"] == PLANTED["fast"].to_dict()
    assert sweep["variants"][0]["name"].startswith(f"#{trials['fast'].number} (chosen) ")
    assert all(v["decode"] and v["prefill"] for v in sweep["variants"])
    assert (report / "decode_vs_batch.png").is_file() and (
        report / "prefill_vs_length.png"
    ).is_file()


def test_a_second_run_resumes_without_new_trials(planted, search_cli):
    before = len(st.load_study(st.open_storage(planted["storage"]), "planted").trials)
    proc = search_cli(planted["args"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = st.load_study(st.open_storage(planted["storage"]), "planted")
    assert len(study.trials) == before
    text = (planted["tmp"] / "ws" / "results.log").read_text()
    assert "its verified best (trial" in text and "no new trials were run" in text
    assert "shape sweep: kept " in text  # same variants, same device: not measured again
    # (No wall-time assertion: on a shared 2-core machine it measured the load, not the code.)


def test_a_second_run_without_trials_asked_spends_its_budget_on_new_trials(
    planted, search_cli, tmp_path
):
    """Resume resumes: the new budget goes to new trials, beyond the study's verified best."""
    shutil.copy(planted["storage"].removeprefix("sqlite:///"), tmp_path / "resumed.db")
    storage = f"sqlite:///{tmp_path}/resumed.db"
    before = len(st.load_study(st.open_storage(storage), "planted").trials)
    args = list(planted["args"])
    args[args.index(planted["storage"])] = storage
    del args[args.index("--trials") : args.index("--trials") + 2]
    args[args.index("--budget-minutes") + 1] = "1.2"
    args[args.index("--workspace") + 1] = str(tmp_path / "ws")
    start = time.monotonic()
    proc = search_cli(args)
    seconds = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = st.load_study(st.open_storage(storage), "planted")
    new = [t for t in study.trials[before:] if t.user_attrs.get("duplicate_of") is None]
    assert len(new) >= 3  # assemblies timed, not copies of those run before
    assert "no new trials were run" not in (tmp_path / "ws" / "results.log").read_text()
    assert seconds <= 1.2 * 60 * 1.05 + 15  # the budget, every phase included


def test_without_optuna_the_ranked_defaults_still_give_a_verified_engine(
    tmp_path, micro_config_path, tiny_weights, fake_renderer, search_cli
):
    args = [
        "run", "--no-optuna", "--model-config", str(micro_config_path), "--weight-dir",
        tiny_weights, "--device", "cpu", "--trials", "1", "--budget-minutes", "4",
        "--traces", "decode", "--renderer", fake_renderer, "--workspace", str(tmp_path / "ws"),
        "--studies-dir", str(tmp_path / "studies"), "--remeasure", "0",
    ]  # fmt: skip
    proc = search_cli(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "ws" / "results.log").read_text()
    assert "--no-optuna: evaluated the ranked default candidates only" in text
    assert not (tmp_path / "studies").exists()
    first = PRESETS["slab-sdpa"].name  # the first ranked default a CPU can run
    assert f"#0   ok         {first}" in text
    assert f"trial 0 {first}: PASSED" in text and "test_correctness.py: exit 0" in text
    assert f"Fake engine for {first}" in (tmp_path / "ws" / "engine.py").read_text()


def test_report_and_render_read_the_stored_study(planted, fake_renderer, tmp_path, capsys):
    from search.cli import main

    assert main(["report", "--storage", planted["storage"], "--study", "planted", "--all"]) == 0
    out = capsys.readouterr().out
    assert "Top 5:" in out and "verified best: trial" in out and "6 trials:" in out
    assert PLANTED["fast"].name in out and "planted crash in create_engine" in out
    assert "decode" in out.split("Per trace")[1]  # per-trace numbers of the leader
    crash = by_source(planted["storage"])["crash"].number
    args = ["render", "--storage", planted["storage"], "--study", "planted", "--renderer"]
    assert (
        main([*args, fake_renderer, "--trial", str(crash), "--output", str(tmp_path / "c.py")]) == 0
    )
    assert f"Fake engine for {PLANTED['crash'].name}" in (tmp_path / "c.py").read_text()
    assert main([*args, fake_renderer, "--output", str(tmp_path / "best.py")]) == 0
    assert f"Fake engine for {PLANTED['fast'].name}" in (tmp_path / "best.py").read_text()
