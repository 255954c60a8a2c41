"""Planted fault: decoded tokens take the position after the right one (the cache length after
the append, not before), so every decode step sees its prompt one position too far away."""

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


class PositionOffByOneEngine(RecomputingEngine):
    def __init__(self, model_config, weight_dir, device="cuda", dtype=None):
        super().__init__(model_config, weight_dir, device, dtype)
        self.prompt_length: dict[int, int] = {}

    def prefill(self, request_ids, input_ids):
        for rid, tokens in zip(request_ids, input_ids, strict=True):
            self.prompt_length[int(rid)] = len(tokens)
        return super().prefill(request_ids, input_ids)

    def decode(self, request_ids, token_ids):
        request_ids = [int(i) for i in request_ids]
        token_ids = token_ids.to(self.device)
        rows = []
        for row, rid in enumerate(request_ids):
            tokens = torch.cat([self.history[rid], token_ids[row : row + 1]])
            self.history[rid] = tokens
            positions = torch.arange(len(tokens))
            # BUG: decoded tokens sit at len(history) instead of len(history) - 1.
            positions[self.prompt_length[rid] :] += 1
            rows.append(last_logits(self.model, tokens, positions))
        return torch.stack(rows)


def create_engine(model_config, weight_dir, device="cuda", dtype=None):
    return PositionOffByOneEngine(model_config, weight_dir, device, dtype)
