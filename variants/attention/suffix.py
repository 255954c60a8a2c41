"""Attention of a prompt's uncached suffix over its cached prefix and itself: causal with an
offset, the query at position start + i sees keys 0..start + i.

The reference's arithmetic (float32 scores and softmax, probabilities cast back), one request at
a time; its score matrix is [heads, suffix, context], small when the prefix cache hits. Runs
anywhere."""

import math

import torch


def suffix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int):
    """q [m, heads, d] at positions start..start+m-1; k, v [start+m, kv_heads, d] at positions
    0..start+m-1. Returns [m, heads * d]."""
    m, heads, d = q.shape
    group = heads // k.shape[1]
    k = k.transpose(0, 1).repeat_interleave(group, dim=0)  # [heads, context, d]
    v = v.transpose(0, 1).repeat_interleave(group, dim=0)
    scores = (q.transpose(0, 1).float() @ k.float().transpose(-1, -2)) / math.sqrt(d)
    rows = torch.arange(start, start + m, device=q.device)
    future = torch.arange(k.shape[1], device=q.device) > rows[:, None]  # [m, context]
    probs = scores.masked_fill(future, float("-inf")).softmax(-1).to(q.dtype)
    return (probs @ v).transpose(0, 1).reshape(m, heads * d)
