"""Kernel tests run on CPU under Triton's interpreter unless a CUDA device is present.

Triton fixes the interpreter choice when it is imported (its own tl functions are jitted then),
so TRITON_INTERPRET is set here before the test modules import triton. If something imported
triton earlier in the session (torch._dynamo does), the CPU cases skip with that reason: run
this folder on its own, or set TRITON_INTERPRET=1 before torch is imported (tests/conftest.py)."""

import os
import sys

import pytest
import torch

STALE_TRITON = None
if not torch.cuda.is_available():
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        STALE_TRITON = (
            "triton was imported before TRITON_INTERPRET=1 was set (by torch._dynamo, say); "
            "run `pytest tests/variants/kernels` on its own"
        )
    else:
        os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def _interpretable_triton():
    if STALE_TRITON:
        pytest.skip(STALE_TRITON)


@pytest.fixture
def embedding_table():
    """A seeded random [vocab, hidden] table: `embedding_table(vocab, hidden, dtype)`."""

    def make(vocab: int, hidden: int, dtype=torch.float16) -> torch.Tensor:
        gen = torch.Generator().manual_seed(vocab + hidden)
        return torch.randn(vocab, hidden, generator=gen).to(dtype)

    return make
