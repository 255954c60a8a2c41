"""Next-token sampling on [B, vocab] float32 logits: greedy, temperature, top-k and top-p
(nucleus), seeded through a torch.Generator so a run can be replayed. Pure torch, any device;
used by the serving scheduler and the notebooks, not rendered into engines.
"""

import math
from dataclasses import dataclass

import torch

# A seed is a signed 64-bit integer; a request's prompts draw with seed + 0, + 1, ..., which
# torch's generator takes up to 2**64 - 1.
SEEDS = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy; top_k 0 and top_p 1.0 switch those filters off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def _check_logits(logits: torch.Tensor) -> None:
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(
            f"logits must be a float [B, vocab] tensor, got {logits.dtype} {list(logits.shape)}"
        )


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The most likely token of each row (the lowest id on a tie), int64 [B]."""
    _check_logits(logits)
    return logits.argmax(dim=-1)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Logits with everything below each row's k-th largest value set to -inf (ties kept)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Logits outside each row's nucleus set to -inf: the smallest set of most likely tokens
    whose probabilities add up to at least p (the most likely token always stays)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above this one
    drop_sorted = before >= p
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One token id per row, int64 [B]: greedy at temperature 0, else a draw from the
    temperature-scaled distribution after the top-k and top-p filters."""
    _check_logits(logits)
    if params.temperature == 0.0:
        return greedy_tokens(logits)
    scaled = logits.float() / params.temperature
    scaled = top_p_filter(top_k_filter(scaled, params.top_k), params.top_p)
    probs = scaled.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class TokenSampler:
    """`sampler(logits) -> ids` with its own seeded generator: the same seed gives the same
    tokens for the same logits, whatever else draws random numbers meanwhile."""

    def __init__(self, params: SamplingParams = SamplingParams(), seed: int = 0, device="cpu"):
        self.params = params
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return sample_tokens(logits, self.params, self.generator)
