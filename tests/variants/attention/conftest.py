"""Attention helpers: the engine's prefill batch for given lengths, and attention computed for
one request alone the way the reference does (repeat_interleave GQA, float32 scores)."""

import math

import pytest
import torch

from variants.attention.padding import PrefillBatch
from variants.cache.plans import CachePlan


def _prefill_batch(lengths) -> PrefillBatch:
    longest = max(lengths)
    uniform = min(lengths) == longest
    pad = [b * longest + p for b, n in enumerate(lengths) for p in range(n)]
    ends = [sum(lengths[: i + 1]) - 1 for i in range(len(lengths))]
    return PrefillBatch(
        list(lengths),
        longest,
        uniform,
        None if uniform else torch.tensor(pad),
        torch.tensor(ends),
    )


def _decode_plan(kv_lens) -> CachePlan:
    return CachePlan(
        rids=list(range(len(kv_lens))),
        kv_lens=torch.tensor(kv_lens),
        max_len=max(kv_lens),
        uniform=min(kv_lens) == max(kv_lens),
    )


def _alone(q, k, v, causal: bool):
    """q [heads, T, d], k/v [kv_heads, S, d] of one request -> [T, heads * d]."""
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        t, s = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(t, s, dtype=torch.bool).triu(1), float("-inf"))
    out = scores.softmax(-1).to(q.dtype) @ v
    return out.transpose(0, 1).reshape(q.shape[1], -1)


@pytest.fixture
def prefill_batch():
    return _prefill_batch


@pytest.fixture
def decode_plan():
    return _decode_plan


@pytest.fixture
def attention_alone():
    return _alone
