"""The study report: PNG figures and summary.md from a stored study, through the command line."""

import subprocess
import sys

import matplotlib.image as mpimg
import optuna
import pytest

from search import study as st
from search.figures import param_importances, pareto_front, write_report
from search.report import default_report_dir
from search.trial import Record

optuna.logging.set_verbosity(optuna.logging.WARNING)

FIGURES = ("tradeoff", "axis_effects", "history", "floor_efficiency", "importances")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def demo(tmp_path_factory, demo_study):
    path = tmp_path_factory.mktemp("study") / "demo.db"
    url = f"sqlite:///{path}"
    return url, demo_study(url, "demo")


def test_report_cli_writes_real_pngs_and_names_the_chosen_engine(demo, child_env, tmp_path):
    url, study = demo
    out = tmp_path / "report"
    cmd = [sys.executable, "-m", "search", "report", "--storage", url, "--out", str(out)]
    done = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Top 5:" in done.stdout and "verified best: trial" in done.stdout  # the table stays
    for name in FIGURES:
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC, name
        assert png.stat().st_size > 10_000, name
        height, width = mpimg.imread(png).shape[:2]
        assert width >= 600 and height >= 300, (name, width, height)
    best = study.user_attrs["verified_best"]
    md = (out / "summary.md").read_text()
    assert f"trial {best['trial']} `{best['variant_name']}`" in md
    assert all(f"({name}.png)" in md for name in FIGURES)
    assert "## Beyond the presets\n\n- beyond the presets: no queued assembly was timed" in md


def test_default_report_dir_sits_next_to_the_study():
    assert str(default_report_dir("sqlite:///studies/x.db", "x")) == "studies/x"
    assert str(default_report_dir("journal:/tmp/j/s.log", "a b")) == "/tmp/j/a_b"
    assert str(default_report_dir("postgresql://h/db", "x")) == "studies/x"
    assert str(default_report_dir("postgresql://h/db", "x", "/tmp/s")) == "/tmp/s/x"


def test_pareto_front_keeps_only_undominated_trials():
    def rec(n, tps, mib):
        attrs = {"tokens_per_s": tps, "peak_mib": mib, "constraint": [-0.4]}
        return Record(n, "ok", {}, attrs, (tps, mib))

    records = [rec(0, 100, 10), rec(1, 90, 20), rec(2, 200, 30), rec(3, 150, 5), rec(4, 200, 40)]
    assert [r.number for r in pareto_front(records)] == [3, 2]


def test_importances_need_enough_feasible_trials(tmp_path, demo_study):
    study = demo_study(f"sqlite:///{tmp_path}/d.db", "d")
    values, why = param_importances(study)
    assert set(values) == {"cache", "attention", "fuse_qkv", "fuse_gate_up"}
    assert abs(sum(values.values()) - 1) < 1e-6 and "PED-ANOVA" in why

    empty = st.open_study(st.open_storage(f"sqlite:///{tmp_path}/e.db"), "e")
    values, why = param_importances(empty)
    assert values == {} and "at least" in why
    paths = write_report(empty, tmp_path / "empty")
    assert [p.name for p in paths] == ["summary.md"]  # nothing to draw, said so
    md = paths[0].read_text()
    assert "No correct trial" in md and "importances.png`: not drawn (only 0" in md


def test_the_commands_log_leaves_matplotlib_s_own_info_lines_out(caplog):
    """Optuna's slice plot hands matplotlib a categorical knob of numbers (block_size) as
    strings, and matplotlib says so at INFO, a line a figure, into run.sh's log; the commands'
    logging keeps matplotlib at WARNING."""
    import logging

    from optuna.visualization import matplotlib as plots

    from search.cli import configure_logging
    from search.figures import optuna_figure

    study = optuna.create_study(direction="maximize")
    for size, value in ((16, 1.0), (64, 2.0), (128, 1.5)):
        dist = {"block_size": optuna.distributions.CategoricalDistribution([16, 64, 128])}
        study.add_trial(optuna.trial.create_trial(params={"block_size": size}, distributions=dist,
                                                  value=value))  # fmt: skip
    loud = logging.getLogger("matplotlib")
    before = loud.level
    said = lambda: [r for r in caplog.records if r.name.startswith("matplotlib")]  # noqa: E731
    try:
        with caplog.at_level(logging.INFO):
            loud.setLevel(logging.NOTSET)
            optuna_figure(plots.plot_slice, study, params=["block_size"])
            assert said()  # what run.sh's log printed
            caplog.clear()
            configure_logging("INFO")
            optuna_figure(plots.plot_slice, study, params=["block_size"])
            assert not said()
    finally:
        loud.setLevel(before)
