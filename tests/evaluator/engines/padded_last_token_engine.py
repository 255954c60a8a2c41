"""Planted fault: a padded batched prefill returns the last padded position of every row."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from evaluator.engine_loader import load_engine_module  # noqa: E402

RecomputingEngine = load_engine_module(
    Path(__file__).with_name("reference_engine.py")
).RecomputingEngine


class PaddedLastTokenEngine(RecomputingEngine):
    def prefill_logits(self, request_ids):
        seqs = [self.history[rid] for rid in request_ids]
        width = max(len(s) for s in seqs)
        padded = torch.stack([torch.nn.functional.pad(s, (0, width - len(s))) for s in seqs])
        # BUG: should take position len(s) - 1 of each row, not the last padded column.
        return self.model.forward(padded)[:, -1].float()


def create_engine(model_config, weight_dir, device="cuda", dtype=None):
    return PaddedLastTokenEngine(model_config, weight_dir, device, dtype)
