"""torch.compile of the per-layer math (norm + QKV + RoPE, and o-proj + MLP), dynamic shapes.

Fuses the elementwise work into fewer kernels; cache writes and attention stay outside so any
layout and backend combine with it. All compilation happens in create_engine's warm-up."""

import torch


def run_compiled(fn, mode: str = "default"):
    return torch.compile(fn, mode=mode, dynamic=True)
