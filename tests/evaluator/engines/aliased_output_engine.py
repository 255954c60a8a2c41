"""Planted fault: logits are returned as a view of one buffer that every call overwrites."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from evaluator.engine_loader import load_engine_module  # noqa: E402

RecomputingEngine = load_engine_module(
    Path(__file__).with_name("reference_engine.py")
).RecomputingEngine


class AliasedOutputEngine(RecomputingEngine):
    out = None

    def into_buffer(self, logits):
        if self.out is None or len(self.out) < len(logits):
            self.out = torch.empty(len(logits), logits.shape[1], device=logits.device)
        # BUG: like a CUDA-graph static output, the next call overwrites what this one returned.
        self.out[: len(logits)].copy_(logits)
        return self.out[: len(logits)]

    def prefill(self, request_ids, input_ids):
        return self.into_buffer(super().prefill(request_ids, input_ids))

    def decode(self, request_ids, token_ids):
        return self.into_buffer(super().decode(request_ids, token_ids))


def create_engine(model_config, weight_dir, device="cuda", dtype=None):
    return AliasedOutputEngine(model_config, weight_dir, device, dtype)
