"""Set-up choices of the main job that depend on the machine: the trial correctness gate and
the memory budget (and a trial over it)."""

from types import SimpleNamespace

import pytest

from search.setup import (
    COURSE_GRADER_GIB,
    CPU_STRESS_MAX_POSITIONS,
    device_memory_gib,
    gate_cases,
    memory_budget_gib,
)


def _job(max_positions: int):
    target = SimpleNamespace(config={"max_position_embeddings": max_positions})
    return SimpleNamespace(target=target, notes=[])


@pytest.mark.parametrize(
    "kind, max_positions, cases",
    [
        ("cpu", 4096, ("public",)),  # the public config on a CPU: stress only at verification
        ("cpu", CPU_STRESS_MAX_POSITIONS, ("public", "stress")),
        ("cpu", 512, ("public", "stress")),
        ("cuda", 4096, ("public", "stress")),
    ],
)
def test_trial_gate_by_device_and_context(kind, max_positions, cases):
    job = _job(max_positions)
    assert gate_cases(job, kind) == cases
    assert bool(job.notes) == (cases == ("public",))  # results.log says when stress waits


def _args(**given):
    return SimpleNamespace(**{"memory_budget_gib": None, "model_config": None, **given})


def test_the_memory_budget_defaults_to_the_graders_gpu_for_the_course_target():
    assert memory_budget_gib(_args(), "cpu") == (COURSE_GRADER_GIB, ANY_REASON)
    budget, why = memory_budget_gib(_args(model_config="m.json"), "cpu")
    assert budget == round(device_memory_gib("cpu"), 1) and why == "this device's memory"
    assert memory_budget_gib(_args(memory_budget_gib=6.5), "cpu") == (6.5, "--memory-budget-gib")


class _AnyReason:
    def __eq__(self, other):
        return "RTX 3090" in other


ANY_REASON = _AnyReason()


def _job_dict(config, weights, tmp_path, budget_mib):
    return {
        "variant": {"cache": "slab"}, "config": config, "weight_dir": weights, "device": "cpu",
        "traces": ["decode"], "protocol": "quick", "check": False,
        "engine_path": str(tmp_path / "engine.py"), "memory_budget_mib": budget_mib,
        "engine_budget_gib": None,
    }  # fmt: skip


def test_a_trial_over_the_memory_budget_in_the_graders_pattern_is_infeasible(
    tiny_config, tiny_weights, tmp_path
):
    from search.trial import Phases, run_job

    phases = Phases(tmp_path / "result.json")
    job = _job_dict(tiny_config, tiny_weights, tmp_path, 10**6)
    screened = run_job(job, phases)  # one engine a trace: not the grader's peak
    assert screened["status"] == "ok" and "grader_peak_mib" not in screened
    assert screened["traces"]["decode"]["pattern"] == "one engine"
    full = run_job({**job, "protocol": "full"}, phases)
    assert full["status"] == "ok" and full["grader_peak_mib"] > 0
    assert full["traces"]["decode"]["pattern"] == "grader"
    for protocol, where in (("quick", "with one engine alive"), ("full", "in the grader's")):
        over = run_job({**job, "protocol": protocol, "memory_budget_mib": 1.0}, phases)
        assert over["status"] == "infeasible" and where in over["reason"]
        assert (
            over["reason"].startswith("peak ")
            and "over the memory budget of 1 MiB" in over["reason"]
        )


def test_a_gated_trial_keeps_the_noise_measurement_for_the_next(
    tiny_config, tiny_weights, tmp_path
):
    from search.trial import Phases, run_job

    job = _job_dict(tiny_config, tiny_weights, tmp_path, None)
    job.update(check=True, gate_cases=["public"], gate={"name": "noise", "dtype": "float16"})
    job.update(noise_cache=str(tmp_path / "noise"), atol=1e-2, rtol=1e-2)
    assert run_job(job, Phases(tmp_path / "result.json"))["status"] == "ok"
    assert len(list((tmp_path / "noise").glob("noise-*.pt"))) == 1


def test_a_trial_under_the_bar_stops_timing_at_that_trace(tiny_config, tiny_weights, tmp_path):
    from search.trial import Phases, run_job

    job = _job_dict(tiny_config, tiny_weights, tmp_path, None)
    job.update(traces=["prefill", "decode", "mixed"], prune_below={"decode": 1e12})
    result = run_job(job, Phases(tmp_path / "result.json"))
    assert result["status"] == "pruned" and list(result["traces"]) == ["prefill", "decode"]
    assert result["reason"].startswith("pruned at decode: ")
    job.update(prune_below={"decode": 1e-6})
    assert run_job(job, Phases(tmp_path / "result.json"))["status"] == "ok"
