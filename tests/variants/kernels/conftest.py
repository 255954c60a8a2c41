"""Kernel tests run on CPU under Triton's interpreter unless a CUDA device is present.

TRITON_INTERPRET is read when a kernel is decorated, so it is set here, before any test module
imports a kernel; with CUDA the GPU tests (marked `gpu`) compile for real instead."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
