"""Study naming, storages, constraints and the outcome of a trial as Optuna sees it."""

import dataclasses
import sys
import time
from datetime import datetime, timedelta

import optuna
import pytest
from optuna.trial import TrialState

from search import study as st
from search.study import copy_result, find_duplicate, tell_outcome
from search.trial import TrialRunner, constraint, outcome_from_result
from variants.probe import probe_capabilities
from variants.variant import Variant

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def caps(tiny_config):
    return probe_capabilities("cpu", tiny_config)


def test_study_name_follows_shape_hardware_and_torch(tiny_config, caps):
    name = st.study_name(tiny_config, caps)
    assert name == st.study_name(dict(tiny_config, architectures=["x"]), caps)  # not a shape key
    assert name != st.study_name(dict(tiny_config, num_hidden_layers=3), caps)
    gpu = dataclasses.replace(caps, gpu_name="NVIDIA GeForce RTX 3090", device_type="cuda")
    assert "nvidia-geforce-rtx-3090-torch" in st.study_name(tiny_config, gpu)
    assert name.startswith("tiny-llama-") and "-cpu-torch" in name


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_storages_open_and_the_dashboard_command(tmp_path, kind):
    url = f"sqlite:///{tmp_path}/s.db" if kind == "sqlite" else f"journal:{tmp_path}/s.log"
    study = st.open_study(st.open_storage(url), "s")
    study.set_user_attr("k", 1)
    again = st.load_study(st.open_storage(url), None)
    assert again.study_name == "s" and again.user_attrs["k"] == 1
    expected = url if kind == "sqlite" else f"{tmp_path}/s.log"
    assert st.dashboard_command(url) == f"optuna-dashboard {expected}"
    assert st.dashboard_command(str(tmp_path / "j.log")) == f"optuna-dashboard {tmp_path}/j.log"


def runner(tiny_config):
    return TrialRunner(tiny_config, "/nowhere", "cpu")


def test_outcomes_become_values_attrs_and_constraints(tiny_config):
    v = Variant()
    ok = {
        "status": "ok",
        "check": {
            "public": {
                "passed": True,
                "max_abs_err": 1e-3,
                "tol_share": 0.1,
                "steps": 6,
                "failure": None,
            }
        },
        "max_abs_err": 1e-3,
        "tol_share": 0.1,
        "traces": {
            "prefill": {
                "tokens_per_s": 100.0,
                "decode_tokens_per_s": 0.0,
                "seconds": 1.0,
                "peak_mib": 50.0,
                "create_s": 0.2,
                "floor_eff": 0.5,
            },
        },
    }
    out = outcome_from_result(ok, v, runner(tiny_config), "quick")
    assert out.values == pytest.approx((100.0, 50.0))
    assert out.constraint == pytest.approx(0.1 - 0.5)
    assert out.attrs["floor_eff_prefill"] == 0.5 and out.attrs["variant"] == v.to_dict()
    full = outcome_from_result(ok, v, runner(tiny_config), "full")
    assert full.attrs["full_tokens_per_s"] == pytest.approx(100.0)
    assert "tokens_per_s" not in full.attrs
    # Correct but 70 % of the tolerance: infeasible by the constraint.
    assert constraint({"status": "infeasible", "tol_share": 0.7}, 0.5) == pytest.approx(0.2)
    # Wrong in a way the share does not show (shape, dtype, aliasing): infeasible anyway.
    assert constraint({"status": "infeasible", "tol_share": 0.0}, 0.5) == 1.0
    failed = outcome_from_result(
        {"status": "failed", "reason": "boom", "timeout": True}, v, runner(tiny_config), "quick"
    )
    assert failed.values is None and failed.attrs["timed_out"] and failed.reason == "boom"


def test_constraints_reach_the_sampler_and_duplicates_reuse_results(tmp_path, tiny_config):
    study = st.open_study(st.open_storage(f"sqlite:///{tmp_path}/c.db"), "c")
    r = runner(tiny_config)
    good = outcome_from_result(
        {
            "status": "ok",
            "tol_share": 0.2,
            "max_abs_err": 0.0,
            "check": {},
            "traces": {
                "t": {
                    "tokens_per_s": 10.0,
                    "decode_tokens_per_s": 1.0,
                    "seconds": 1.0,
                    "peak_mib": 5.0,
                    "create_s": 0.1,
                }
            },
        },
        Variant(cache="slab"),
        r,
        "quick",
    )
    wrong = outcome_from_result(
        {"status": "infeasible", "tol_share": 3.0, "reason": "wrong"},
        Variant(cache="paged"),
        r,
        "quick",
    )
    for outcome in (good, wrong):
        tell_outcome(study, study.ask(), outcome)
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert [t.user_attrs["constraint"][0] > 0 for t in trials] == [False, True]
    assert trials[1].constraints == {"correctness": pytest.approx(2.5)}
    # The same variant again is not run: the trial copies the earlier result, told pruned (no
    # second point where TPE already looked), and a later copy names the trial that ran it.
    earlier = find_duplicate(study, Variant(cache="slab"))
    assert earlier.number == 0
    for _ in range(2):
        trial = study.ask()
        assert (
            copy_result(study, trial, find_duplicate(study, Variant(cache="slab"))) == "duplicate"
        )
    copies = study.get_trials()[2:]
    assert [t.state for t in copies] == [TrialState.PRUNED] * 2 and copies[0].values is None
    assert [t.user_attrs["duplicate_of"] for t in copies] == [0, 0]
    assert "tokens_per_s" not in copies[0].user_attrs  # (counted once, with the trial that ran)
    records = st.load_records(study)
    assert [r.status for r in records] == ["ok", "infeasible", "duplicate", "duplicate"]


def test_stale_running_trials_are_failed(tmp_path):
    study = st.open_study(st.open_storage(f"sqlite:///{tmp_path}/stale.db"), "stale")
    trial = study.ask()
    assert st.fail_stale_trials(study, older_than_s=3600) == 0
    later = datetime.now() + timedelta(hours=2)

    class Clock(datetime):
        @classmethod
        def now(cls, tz=None):
            return later

    import search.study as module

    original = module.datetime
    module.datetime = Clock
    try:
        assert st.fail_stale_trials(study, older_than_s=3600) == 1
    finally:
        module.datetime = original
    frozen = study.get_trials()[trial.number]
    assert frozen.state == TrialState.FAIL and "stale" in frozen.user_attrs["reason"]


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")
def test_a_trial_whose_heartbeat_stopped_is_failed(tmp_path):
    url = f"sqlite:///{tmp_path}/beats.db"
    study = st.open_study(st.open_storage(url, heartbeat_s=1), "beats")
    assert st.heartbeat_interval(study) == 1
    trial = study.ask()
    with st.heartbeat(study, [trial]):
        time.sleep(0.2)  # the first beat is recorded at once
    # The beats stopped as if the process died; after the grace period (3 beats, by the
    # database's clock, whole seconds in SQLite) the next process fails the trial.
    time.sleep(st.GRACE_BEATS + 1.2)
    other = st.load_study(st.open_storage(url, heartbeat_s=1), "beats")
    assert st.fail_stale_trials(other, older_than_s=3600) == 1
    assert st.fail_stale_trials(other, older_than_s=3600) == 0  # once
    frozen = other.get_trials()[trial.number]
    assert frozen.state == TrialState.FAIL and frozen.user_attrs["status"] == "failed"
    assert "stopped beating (no heartbeat for 3 s)" in frozen.user_attrs["reason"]


def test_a_missing_database_driver_is_one_line_naming_the_extra(
    monkeypatch, capsys, tmp_path, micro_config_path, tiny_weights
):
    from search.cli import main
    from variants.probe import UserError

    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` raises ImportError
    url = "postgresql://someone:secret@127.0.0.1:1/optuna"
    with pytest.raises(UserError) as err:
        st.open_storage(url)
    message = str(err.value)
    assert message.startswith("the postgresql storage's database driver is missing (")
    assert message.endswith('pip install -e ".[postgres]"')
    assert "\n" not in message and "secret" not in message
    # Every command that opens a storage says it in one line and exits 2.
    assert main(["report", "--storage", url, "--study", "x", "--no-plots"]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    run = ["run", "--model-config", str(micro_config_path), "--weight-dir", tiny_weights]
    run += ["--device", "cpu", "--storage", url, "--workspace", str(tmp_path / "ws")]
    assert main(run) == 2  # not "the search failed", and nothing written
    assert capsys.readouterr().err.endswith(f"error: {message}\n")
    assert not (tmp_path / "ws").exists()


def test_the_verified_best_of_an_earlier_study_on_this_hardware_is_enqueued_first(tmp_path, caps):
    from search.setup import SearchSpace
    from search.study import enqueue_known_good

    storage = st.open_storage(f"sqlite:///{tmp_path}/many.db")
    earlier_best = Variant(cache="paged", block_size=32, attention="sdpa", fuse_qkv=False)
    other = st.open_study(storage, "other-model")
    other.set_user_attr("hardware", st.hardware_key(caps))
    other.set_user_attr("verified_best", {"variant": earlier_best.to_dict()})
    elsewhere = st.open_study(storage, "other-hardware")
    elsewhere.set_user_attr("hardware", "nvidia-rtx-3090-torch2.3.0")
    elsewhere.set_user_attr("verified_best", {"variant": Variant(cache="contiguous").to_dict()})

    study = st.open_study(storage, "this-model")
    queued = enqueue_known_good(
        study, SearchSpace(caps), caps, storage, "this-model", st.hardware_key(caps), None
    )
    assert queued[0].startswith("best of other-model")
    assert not any("other-hardware" in q for q in queued)
    first = study.get_trials()[0]
    assert first.user_attrs["variant"] == earlier_best.to_dict()
    # A study is seeded once: a second call (a resumed run) enqueues nothing.
    assert (
        enqueue_known_good(study, SearchSpace(caps), caps, storage, "this-model", "x", None) == []
    )


def test_a_timeout_under_a_shortened_limit_says_the_budget_cut_it(tiny_config, tmp_path):
    """A trial given only the budget's last seconds and killed there is no verdict on its
    variant; one killed at the full trial limit is."""
    r = TrialRunner(tiny_config, "/nowhere", "cpu", timeout_s=300.0)
    output, log = tmp_path / "result.json", tmp_path / "log.txt"
    log.write_text("INFO phase benchmark\n")
    (tmp_path / "result.json.phase").write_text("benchmark")
    short = r._result(output, None, 45.0, log)
    assert short["timeout"] is True and short["status"] == "failed"
    assert short["reason"].startswith(
        "timed out after 45 s during benchmark (cut short by the search budget: a trial may "
        "take 300 s, so this says nothing about the variant)"
    )
    full = r._result(output, None, 300.0, log)
    assert full["reason"].startswith("timed out after 300 s during benchmark\n")
    assert "budget" not in full["reason"]
    died = r._result(output, 3, 45.0, log)
    assert died["reason"].startswith("process died (exit code 3) during benchmark")
    assert "budget" not in died["reason"] and died["timeout"] is False


def test_a_trial_far_behind_the_best_on_a_trace_is_pruned(tmp_path, tiny_config):
    """The bar is a quarter of the best correct trial's speed per trace; a pruned trial is
    PRUNED for Optuna, keeps the traces it ran, and a repeat of its variant is pruned too."""
    study = st.open_study(st.open_storage(f"sqlite:///{tmp_path}/p.db"), "p")
    r = runner(tiny_config)
    r.traces = ("prefill", "decode")
    assert st.prune_bar(study, r) == {}  # no best yet
    timing = {"decode_tokens_per_s": 1.0, "seconds": 1.0, "peak_mib": 5.0, "create_s": 0.1}
    traces = {
        "prefill": {**timing, "tokens_per_s": 400.0},
        "decode": {**timing, "tokens_per_s": 100.0},
    }
    good = {"status": "ok", "tol_share": 0.2, "max_abs_err": 0.0, "check": {}, "traces": traces}
    tell_outcome(study, study.ask(), outcome_from_result(good, Variant(cache="slab"), r, "quick"))
    assert st.prune_bar(study, r) == {"prefill": 100.0, "decode": 25.0}
    pruned = {
        "status": "pruned",
        "reason": "pruned at prefill: 50 tok/s, under 0.25 of the best trial's (400)",
        "tol_share": 0.2,
        "max_abs_err": 0.0,
        "check": {},
        "traces": {"prefill": {**timing, "tokens_per_s": 50.0}},
    }
    outcome = outcome_from_result(pruned, Variant(cache="paged"), r, "quick")
    assert outcome.values is None and outcome.attrs["tps_prefill"] == 50.0
    tell_outcome(study, study.ask(), outcome)
    assert study.get_trials()[-1].state == TrialState.PRUNED
    earlier = find_duplicate(study, Variant(cache="paged"))
    assert earlier.number == 1 and copy_result(study, study.ask(), earlier) == "pruned"
    assert study.get_trials()[-1].state == TrialState.PRUNED
    records = st.load_records(study)
    assert [x.status for x in records] == ["ok", "pruned", "pruned"]
    assert not any(x.feasible for x in records[1:])


def test_locate_study_names_the_study_or_says_which_to_pass(tmp_path):
    from variants.probe import UserError

    with pytest.raises(UserError, match="no study in .* yet: run `bash run.sh` first"):
        st.locate_study(None, None, tmp_path)
    for name in ("a", "b"):
        optuna.create_study(study_name=name, storage=f"sqlite:///{tmp_path / name}.db")
    with pytest.raises(UserError, match="which study\\? .* holds: a, b; pass --study NAME"):
        st.locate_study(None, None, tmp_path)
    study, url = st.locate_study(None, "b", tmp_path)
    assert study.study_name == "b" and url == f"sqlite:///{tmp_path / 'b'}.db"
    st.remember_last_run(tmp_path, url, "b")  # the last run's, without --study
    assert st.locate_study(None, None, tmp_path)[0].study_name == "b"
