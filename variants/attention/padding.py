"""Packed <-> padded layouts for prefill attention.

Prompts of one call are packed ([tokens, heads, head_dim]) for the projections and padded on the
right ([batch, heads, max_len, head_dim]) for attention. Right padding needs no extra mask: a
real query at position p only sees keys <= p under the causal mask, all of them real."""

from dataclasses import dataclass

import torch


@dataclass
class PrefillBatch:
    lengths: list
    max_len: int
    uniform: bool  # all prompts the same length: padding is a reshape
    pad_index: torch.Tensor | None  # [tokens] row of each packed token in [batch * max_len]
    last_index: torch.Tensor  # [batch] packed index of each prompt's last token
    cu_seqlens: torch.Tensor | None = None  # [batch + 1] int32 prefix sums, for varlen kernels
    schedule: torch.Tensor | None = None  # [2, S] q-block table: a fixed grid (CUDA graphs)


def to_padded(x: torch.Tensor, batch: PrefillBatch) -> torch.Tensor:
    """[tokens, heads, d] -> [batch, heads, max_len, d]."""
    b, heads, d = len(batch.lengths), x.shape[1], x.shape[2]
    if not batch.uniform:
        x = x.new_zeros(b * batch.max_len, heads, d).index_copy_(0, batch.pad_index, x)
    return x.view(b, batch.max_len, heads, d).transpose(1, 2)


def from_padded(o: torch.Tensor, batch: PrefillBatch) -> torch.Tensor:
    """[batch, heads, max_len, d] -> [tokens, heads * d]."""
    b, heads, t, d = o.shape
    flat = o.transpose(1, 2).reshape(b * t, heads * d)
    return flat if batch.uniform else flat.index_select(0, batch.pad_index)


def window_mask(t: int, window: int, device) -> torch.Tensor:
    """[t, t] True where query i sees key j: causal, and within the last `window` positions
    (i - window < j <= i), as a sliding-window model attends (Mistral)."""
    i = torch.arange(t, device=device)
    offset = i[:, None] - i[None, :]
    return (offset >= 0) & (offset < window)


def live_keys(plan, window: int | None, device) -> torch.Tensor | None:
    """[B, S] True at each decode row's keys it attends to: those within its context length, and
    within the last `window` positions where the model has one; None where every key is live."""
    if plan.uniform and window is None:
        return None
    at = torch.arange(plan.max_len, device=device)
    live = at < plan.kv_lens[:, None]
    if window is not None:
        live &= at >= plan.kv_lens[:, None] - window
    return live
