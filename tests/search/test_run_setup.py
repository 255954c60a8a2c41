"""Set-up choices of the main job that depend on the machine: the trial correctness gate."""

from types import SimpleNamespace

import pytest

from search.run_setup import CPU_STRESS_MAX_POSITIONS, gate_cases


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
