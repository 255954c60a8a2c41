"""Planted fault: RoPE in the rotate-half convention instead of interleaved pairs."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from explicit_forward import last_logits  # noqa: E402

from evaluator.engine_loader import load_engine_module  # noqa: E402

RecomputingEngine = load_engine_module(
    Path(__file__).with_name("reference_engine.py")
).RecomputingEngine


def rope_rotate_half(x, cos, sin):
    # BUG: pairs (x[j], x[j + d/2]) instead of the contract's (x[2j], x[2j+1]).
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class RopeRotateHalfEngine(RecomputingEngine):
    def last_logits(self, tokens):
        return last_logits(self.model, tokens, rope=rope_rotate_half)


def create_engine(model_config, weight_dir, device="cuda", dtype=None):
    return RopeRotateHalfEngine(model_config, weight_dir, device, dtype)
