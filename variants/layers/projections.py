"""Linear projections of a layer: QKV and the gated MLP, fused (one matmul) or separate.

Fused weights are concatenated rows, so the fused and separate paths compute the same dot
products; fusion saves kernel launches (2 of 3 for QKV, 1 of 2 for gate-up)."""

import torch
import torch.nn.functional as F


def project_qkv(h: torch.Tensor, weights: list, q_dim: int, kv_dim: int, biases=None):
    """q, k, v; `biases` (as `weights`, fused or not) where the model has them (Qwen2)."""
    biases = biases or [None] * len(weights)
    if len(weights) == 1:
        return F.linear(h, weights[0], biases[0]).split((q_dim, kv_dim, kv_dim), dim=-1)
    return tuple(F.linear(h, w, b) for w, b in zip(weights, biases))


def project_gate_up(h: torch.Tensor, gate_up: list) -> tuple:
    if len(gate_up) == 1:
        return F.linear(h, gate_up[0]).chunk(2, dim=-1)
    return F.linear(h, gate_up[0]), F.linear(h, gate_up[1])


def gated_mlp(h: torch.Tensor, gate_up: list, down: torch.Tensor) -> torch.Tensor:
    gate, up = project_gate_up(h, gate_up)
    return F.linear(F.silu(gate) * up, down)
