"""A simple correct engine: keeps each request's tokens and recomputes with the reference model.

Slow on purpose (every call recomputes full histories); the planted-fault engines next to it
subclass `RecomputingEngine` and change one thing each.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from evaluator.reference_model import ReferenceModel  # noqa: E402


class RecomputingEngine:
    def __init__(self, model_config: dict, weight_dir: str, device: str = "cuda", dtype=None):
        self.device = torch.device(device)
        self.model = ReferenceModel(model_config, weight_dir, self.device, dtype)
        self.history: dict[int, torch.Tensor] = {}

    def last_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Float32 logits `[vocab]` after the last of `tokens`."""
        return self.model.forward(tokens[None])[0, -1].float()

    def prefill_logits(self, request_ids: list[int]) -> torch.Tensor:
        return torch.stack([self.last_logits(self.history[i]) for i in request_ids])

    def prefill(self, request_ids, input_ids) -> torch.Tensor:
        request_ids = [int(i) for i in request_ids]
        for rid, tokens in zip(request_ids, input_ids, strict=True):
            self.history[rid] = tokens.to(self.device)
        return self.prefill_logits(request_ids)

    def decode(self, request_ids, token_ids) -> torch.Tensor:
        request_ids = [int(i) for i in request_ids]
        token_ids = token_ids.to(self.device)
        for row, rid in enumerate(request_ids):
            self.history[rid] = torch.cat([self.history[rid], token_ids[row : row + 1]])
        return torch.stack([self.last_logits(self.history[i]) for i in request_ids])

    def remove(self, request_ids) -> None:
        for rid in request_ids:
            del self.history[int(rid)]


def create_engine(model_config: dict, weight_dir: str, device: str = "cuda", dtype=None):
    """`dtype` (not the grader's): compute in it instead of the contract's dtype."""
    return RecomputingEngine(model_config, weight_dir, device, dtype)
