"""optuna-dashboard serves a study as the search writes it: trials, values, user attributes."""

import json
import urllib.request

import optuna
import pytest

from search import study as st
from search.study import tell_outcome
from search.trial import TrialRunner, outcome_from_result
from variants.variant import Variant

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _result(tps: float, mib: float) -> dict:
    trace = {
        "tokens_per_s": tps,
        "decode_tokens_per_s": tps / 2,
        "seconds": 1.0,
        "peak_mib": mib,
        "create_s": 0.1,
        "floor_eff": 0.25,
    }
    return {
        "status": "ok",
        "tol_share": 0.1,
        "max_abs_err": 1e-3,
        "check": {},
        "traces": {"short": trace},
    }


def _write_study(url: str, tiny_config: dict) -> optuna.Study:
    """Two trials through the search's own telling path (constraint, attrs, metric names)."""
    study = st.open_study(st.open_storage(url), "dash")
    runner = TrialRunner(tiny_config, "/nowhere", "cpu")
    for cache, tps, mib in (("slab", 120.0, 40.0), ("paged", 100.0, 30.0)):
        trial = study.ask()
        trial.suggest_categorical("cache", ["slab", "paged"])
        variant = Variant(cache=cache)
        tell_outcome(study, trial, outcome_from_result(_result(tps, mib), variant, runner, "quick"))
    study.set_user_attr("hardware", "cpu-test")
    return study


def test_dashboard_serves_the_study_trials_and_user_attrs(tmp_path, tiny_config, dashboard_server):
    url = f"sqlite:///{tmp_path}/dash.db"
    _write_study(url, tiny_config)
    base = dashboard_server(url)
    studies = _get(f"{base}/api/studies")["study_summaries"]
    assert [s["study_name"] for s in studies] == ["dash"]
    summary = studies[0]
    assert {"key": "hardware", "value": "cpu-test"} in summary["user_attrs"]

    detail = _get(f"{base}/api/studies/{summary['study_id']}")
    assert detail.get("objective_names") == ["tokens_per_s", "peak_mib"]  # set_metric_names
    trials = detail["trials"]
    assert [t["state"] for t in trials] == ["Complete", "Complete"]
    values = [v for t in trials for v in t["values"]]
    assert values == pytest.approx([120.0, 40.0, 100.0, 30.0])
    attrs = {a["key"]: a["value"] for a in trials[0]["user_attrs"]}
    assert attrs["variant_name"] == Variant(cache="slab").name
    assert attrs["status"] == "ok" and float(attrs["tps_short"]) == 120.0
    assert json.loads(attrs["variant"])["cache"] == "slab"
    assert [p["name"] for p in trials[1]["params"]] == ["cache"]
    assert len(detail["best_trials"]) == 2  # neither dominates the other
