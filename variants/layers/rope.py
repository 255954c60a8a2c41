"""Interleaved rotary embeddings (pairs 2j, 2j+1), the course convention, not rotate-half.

cos/sin are tabulated once for every position in float32 and cast to the compute dtype, as the
reference does; a call gathers the rows of its positions. Llama 3.x's `llama3` scaling changes
the frequencies only (`scaled_frequencies`), so every layer implementation reads it for free."""

import math

import torch


def scaled_frequencies(inv_freq: torch.Tensor, scaling: tuple) -> torch.Tensor:
    """Llama 3.x's rescaled frequencies: `scaling` = (factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings). Wavelengths shorter than original / high_freq_factor
    keep their frequency, those longer than original / low_freq_factor are divided by factor,
    and the band between is interpolated."""
    factor, low, high, original = scaling
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelength > original / low, inv_freq / factor, blended)
    return torch.where(wavelength < original / high, inv_freq, out)


class RopeTable:
    def __init__(self, head_dim: int, max_positions: int, theta: float, device, dtype,
                 scaling: tuple | None = None):  # fmt: skip
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        if scaling is not None:
            inv_freq = scaled_frequencies(inv_freq, scaling)
        angles = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.cos = angles.cos().to(device=device, dtype=dtype)
        self.sin = angles.sin().to(device=device, dtype=dtype)

    def at(self, positions: torch.Tensor):
        """cos, sin for each position: [N, head_dim/2] each, ready to broadcast over heads."""
        return self.cos[positions], self.sin[positions]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, head_dim]; cos/sin [N, head_dim/2]."""
    pairs = x.unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
