"""optuna-dashboard in a real browser: headless Chromium renders a study's page, which shows its
trials and the chosen engine (the `verified_best` study attribute).

Chromium's own `--dump-dom` and `--screenshot` after `--virtual-time-budget` (the page's
JavaScript, its API calls and its charts run first): no driver to install or keep in step with
the browser. Set AUTOTUNER_DASHBOARD_PNG=docs/dashboard.png to write the docs' screenshot.
"""

import html
import os
import re
import shutil
import subprocess

import optuna
import pytest

from search import study as st
from search.setup import SearchSpace
from search.study import tell_outcome
from search.trial import TrialRunner, outcome_from_result
from variants.presets import PRESETS
from variants.probe import probe_capabilities
from variants.variant import Variant

optuna.logging.set_verbosity(optuna.logging.WARNING)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
# What works as root in a closed sandbox: no setuid sandbox, no GPU, no calls home.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=15000",
]
CHOSEN = Variant(cache="slab", attention="sdpa")
TRIALS = [  # (variant, status, tokens/s, peak MiB)
    (CHOSEN, "ok", 3221.8, 237.0),
    (Variant(cache="paged", attention="sdpa"), "ok", 1220.1, 201.0),
    (PRESETS["safest"], "ok", 682.0, 237.0),
    (Variant(cache="slab", attention="manual", fuse_qkv=True), "infeasible", 0, 0),
    (Variant(cache="contiguous", attention="sdpa"), "failed", 0, 0),
]


def _result(status: str, tps: float, mib: float) -> dict:
    if status == "failed":
        return {"status": "failed", "reason": "RuntimeError: planted crash in create_engine"}
    trace = {"tokens_per_s": tps, "decode_tokens_per_s": tps, "seconds": 1.0, "peak_mib": mib}
    trace |= {"create_s": 0.1, "floor_eff": 0.2}
    share = 0.1 if status == "ok" else 50.0
    result = {"status": status, "tol_share": share, "max_abs_err": share / 100, "check": {}}
    return result | ({"traces": {"decode": trace}} if status == "ok" else {})


def write_study(url: str, tiny_config: dict) -> None:
    """Trials told the way the search tells them, and the verified best as `run` records it."""
    study = st.open_study(st.open_storage(url), "browser")
    space = SearchSpace(probe_capabilities("cpu", tiny_config))
    runner = TrialRunner(tiny_config, "/nowhere", "cpu")
    for variant, status, tps, mib in TRIALS:
        study.enqueue_trial(space.params_for(space.canonical(variant)))
        trial = study.ask()
        assert space.suggest(trial) == space.canonical(variant)
        tell_outcome(
            study, trial, outcome_from_result(_result(status, tps, mib), variant, runner, "quick")
        )
    study.set_user_attr(
        "verified_best",
        {"trial": 0, "variant": CHOSEN.to_dict(), "variant_name": CHOSEN.name,
         "tokens_per_s": 3221.8, "peak_mib": 237.0, "n_trials": len(TRIALS)},
    )  # fmt: skip


def page_text(url: str, tmp_path) -> str:
    """The page's visible text once its scripts have run (tags, styles and scripts dropped)."""
    dom = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    dom = re.sub(r"<(style|script|svg)\b.*?</\1>", " ", dom, flags=re.S)
    text = html.unescape(re.sub(r"<[^>]+>", "|", dom))
    return re.sub(r"\s*(\|\s*)+", " | ", text)  # one " | " between the texts of elements


def test_the_dashboard_page_shows_the_trials_and_the_chosen_engine(
    tmp_path, tiny_config, dashboard_server
):
    url = f"sqlite:///{tmp_path}/browser.db"
    write_study(url, tiny_config)
    page = f"{dashboard_server(url)}/dashboard/studies/1"

    trials = page_text(f"{page}/trials", tmp_path)
    assert f"| {len(TRIALS)} Trials |" in trials, trials[:2000]
    states = re.findall(r"\| Trial (\d+) \| (Complete|Fail) (?=\|)", trials)
    assert states == [
        ("0", "Complete"),
        ("1", "Complete"),
        ("2", "Complete"),
        ("3", "Complete"),
        ("4", "Fail"),
    ]

    study = page_text(page, tmp_path)
    assert "| Best Trials |" in study, study[:2000]
    attributes = study.split("| Study User Attributes |")[1]
    assert "| verified_best |" in attributes
    assert f'"variant_name": "{CHOSEN.name}"' in attributes  # the chosen engine, by name
    # (Its Best Trials list the Pareto front without the constraints: the wrong trial 3, told
    # (0, 0) like every infeasible one, is there too. The chosen engine is `verified_best`.)

    shot = os.environ.get("AUTOTUNER_DASHBOARD_PNG") or str(tmp_path / "dashboard.png")
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}"]
    cmd += ["--window-size=1280,2200", "--force-device-scale-factor=0.6", "--hide-scrollbars", page]
    subprocess.run(cmd, capture_output=True, timeout=120)
    with open(shot, "rb") as png:
        assert png.read(8) == b"\x89PNG\r\n\x1a\n"
