"""Planted fault: a prefill of a live id appends the new prompt to the old state."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from evaluator.engine_loader import load_engine_module  # noqa: E402

RecomputingEngine = load_engine_module(
    Path(__file__).with_name("reference_engine.py")
).RecomputingEngine


class ReprefillAppendsEngine(RecomputingEngine):
    def prefill(self, request_ids, input_ids):
        ids = [int(i) for i in request_ids]
        # BUG: the state of a live id must be replaced, not extended.
        input_ids = [
            torch.cat([self.history[rid], tokens.to(self.device)])
            if rid in self.history
            else tokens
            for rid, tokens in zip(ids, input_ids, strict=True)
        ]
        return super().prefill(ids, input_ids)


def create_engine(model_config, weight_dir, device="cuda", dtype=None):
    return ReprefillAppendsEngine(model_config, weight_dir, device, dtype)
