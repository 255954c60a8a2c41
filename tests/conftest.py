"""Shared fixtures: the tiny test model (GQA, head_dim != hidden/heads) and its weights."""

import json
import os
from pathlib import Path

import pytest
import torch

# Triton picks its interpreter when first imported, and torch._dynamo imports it during
# collection: without a GPU, the kernels' tests need the interpreter chosen before anything else.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from evaluator.toy_weights import save_toy_weights

TINY_CONFIG_PATH = Path(__file__).parent / "data" / "tiny_config.json"


@pytest.fixture(scope="session")
def tiny_config() -> dict:
    return json.loads(TINY_CONFIG_PATH.read_text())


@pytest.fixture(scope="session")
def tiny_weights(tiny_config, tmp_path_factory) -> str:
    """Course toy weights (std 0.02): what the grader's model looks like."""
    d = tmp_path_factory.mktemp("tiny_weights")
    save_toy_weights(tiny_config, d / "model.pt", seed=1234)
    return str(d)


@pytest.fixture(scope="session")
def sharp_weights(tiny_config, tmp_path_factory) -> str:
    """Sharper attention and realistic logit sizes, so RoPE and masking bugs show."""
    d = tmp_path_factory.mktemp("sharp_weights")
    save_toy_weights(tiny_config, d / "model.pt", seed=99, qk_scale=12.0, head_scale=10.0)
    return str(d)
