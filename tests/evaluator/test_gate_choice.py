"""Which gate a target gets, with its reason, and the gate as JSON."""

import json
import shutil
from pathlib import Path

import pytest

from evaluator.gate_choice import gate_from_dict, select_gate
from evaluator.gates import CourseGate, NoiseGate

REPO_ROOT = Path(__file__).resolve().parents[2]
COURSE_CONFIG = REPO_ROOT / "target" / "model_config.json"


def test_course_target_gets_the_course_gate(tmp_path):
    config = json.loads(COURSE_CONFIG.read_text())
    for path in (COURSE_CONFIG, Path("/target/model_config.json")):
        gate, reason = select_gate(path, config)
        assert gate == CourseGate(atol=1e-2, rtol=1e-2, measure_noise=True)
        assert reason.startswith(f"course gate: {path} is the course's float16 target")
        assert "atol=0.01 rtol=0.01" in reason and "\n" not in reason


def test_other_targets_get_the_noise_gate(tmp_path):
    config = json.loads(COURSE_CONFIG.read_text())
    copy = tmp_path / "model_config.json"
    shutil.copy(COURSE_CONFIG, copy)
    gate, reason = select_gate(copy, config)
    assert gate == NoiseGate(multiple=4.0, greedy_margin=2.0)
    assert reason.startswith(f"noise gate: {copy} is not the course's target; error within 4x")
    # The course's path with another dtype is not the course's model.
    gate, reason = select_gate(COURSE_CONFIG, {**config, "torch_dtype": "bfloat16"})
    assert gate.name == "noise"
    assert "is a bfloat16 model, the course's check is for float16" in reason


@pytest.mark.parametrize(
    "gate", [CourseGate(), CourseGate(atol=0.02, measure_noise=True), NoiseGate(dtype="bfloat16")]
)
def test_gate_round_trips_through_json(gate):
    assert gate_from_dict(json.loads(json.dumps(gate.to_dict()))) == gate


def test_unknown_gate_is_named():
    with pytest.raises(ValueError, match="unknown gate 'exact'; known: course, noise"):
        gate_from_dict({"name": "exact"})
