"""Which correctness gate a target gets, and why: the course's exact check for the course's
float16 model (its config at `/target` or this repo's `target/`), the noise gate for everything
else. Also the gate as JSON, for trial jobs.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from evaluator.gates import CourseGate, Gate, NoiseGate
from evaluator.reference_model import config_dtype_name, dtype_named

REPO_ROOT = Path(__file__).resolve().parents[1]
COURSE_CONFIG_PATHS = (
    Path("/target/model_config.json"),
    REPO_ROOT / "target" / "model_config.json",
)


def gate_from_dict(values: dict) -> Gate:
    """The inverse of `Gate.to_dict` (trial jobs carry their gate as JSON)."""
    values = dict(values)
    kinds = {CourseGate.name: CourseGate, NoiseGate.name: NoiseGate}
    name = values.pop("name", None)
    if name not in kinds:
        raise ValueError(f"unknown gate {name!r}; known: {', '.join(kinds)}")
    return kinds[name](**values)


def is_course_target(config_path: str | os.PathLike, config: dict) -> bool:
    """The course's model: its config path (`/target` or this repo's `target/`) and float16."""
    path = Path(config_path).resolve()
    at_course_path = any(path == p.resolve() for p in COURSE_CONFIG_PATHS)
    return at_course_path and dtype_named(config_dtype_name(config)) == torch.float16


def select_gate(config_path: str | os.PathLike, config: dict) -> tuple[Gate, str]:
    """The gate for a target and a one-line reason: the course's exact check for the course's
    model, the noise gate for everything else."""
    dtype = config_dtype_name(config)
    if is_course_target(config_path, config):
        gate = CourseGate(measure_noise=True)
        return gate, (
            f"course gate: {config_path} is the course's {dtype} target, judged as the grader "
            f"does (allclose atol={gate.atol:g} rtol={gate.rtol:g} against the same-dtype "
            "reference)"
        )
    gate = NoiseGate()
    if dtype_named(dtype) == torch.float16:
        where = "is not the course's target"
    else:
        where = f"is a {dtype} model, the course's check is for float16"
    return gate, (
        f"noise gate: {config_path} {where}; error within {gate.multiple:g}x the model dtype's "
        "own rounding noise against a float64/float32 reference, greedy tokens agree"
    )
