"""A stand-in renderer for the search tests: small engines with faults planted by variant value.

Every engine is the reference model recomputing each request's history (slow, correct), unless
the variant plants a fault: `cache="contiguous"` raises in create_engine, paged with block 256
hangs, paged with block 128 is off by 0.007 (passes, but uses ~70 % of the tolerance: too close),
manual attention with fused QKV returns wrong logits. Some choices slow each call by a multiple
of its own time (so the ranking of the correct ones is known on any machine, and stays above the
search's pruning bar): slab + SDPA + fused + eager is the fastest. FAKE_ENGINE_CREATE_S in a
process's environment adds that many seconds to each engine's creation there.
"""

from __future__ import annotations

from pathlib import Path

TEMPLATE = """
import os
import time

import torch

from evaluator.reference_model import ReferenceModel

FAULT = {fault!r}
SLOWDOWN = {delay!r}  # each call also sleeps this multiple of its own time


class Engine:
    def __init__(self, model_config, weight_dir, device):
        self.device = torch.device(device)
        self.model = ReferenceModel(model_config, weight_dir, self.device)
        self.history = {{}}

    def _rows(self, ids):
        start = time.perf_counter()
        out = torch.stack([self.model.forward(self.history[i][None])[0, -1].float() for i in ids])
        time.sleep(SLOWDOWN * (time.perf_counter() - start))
        if FAULT == "off_by_0.007":
            out = out + 0.007
        elif FAULT == "wrong":
            out = out + 0.5
        return out

    def prefill(self, request_ids, input_ids):
        ids = [int(i) for i in request_ids]
        for rid, tokens in zip(ids, input_ids):
            self.history[rid] = tokens.to(self.device)
        return self._rows(ids)

    def decode(self, request_ids, token_ids):
        ids = [int(i) for i in request_ids]
        token_ids = token_ids.to(self.device)
        for row, rid in enumerate(ids):
            self.history[rid] = torch.cat([self.history[rid], token_ids[row : row + 1]])
        return self._rows(ids)

    def remove(self, request_ids):
        for rid in request_ids:
            del self.history[int(rid)]


def create_engine(model_config, weight_dir, device="cuda"):
    time.sleep(float(os.environ.get("FAKE_ENGINE_CREATE_S", "0")))  # a process made slower
    if FAULT == "crash":
        raise RuntimeError("planted crash in create_engine")
    if FAULT == "hang":
        time.sleep(3600)
    return Engine(model_config, weight_dir, device)
"""


def fault_of(variant) -> str | None:
    if variant.cache == "contiguous":
        return "crash"
    if variant.cache == "paged" and variant.block_size == 256:
        return "hang"
    if variant.cache == "paged" and variant.block_size == 128:
        return "off_by_0.007"
    if variant.attention == "manual" and variant.fuse_qkv:
        return "wrong"
    return None


def delay_of(variant) -> float:
    """How many times its own time a call sleeps on top: the slowest correct preset (manual
    attention, unfused) takes 2.25x the fastest's time, above the pruning bar (0.25 of the best's
    speed) whatever the machine."""
    delay = 0.0
    delay += 1.0 if variant.attention == "manual" else 0.0
    delay += 0.5 if variant.cache == "paged" else 0.0
    delay += 0.75 if variant.execution == "compile" else 0.0
    delay += 0.25 if not (variant.fuse_qkv and variant.fuse_gate_up) else 0.0
    return delay


def render_engine(variant, path, header: str = "", memory_budget_gib=None, weights="any") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    body = TEMPLATE.format(fault=fault_of(variant), delay=delay_of(variant))
    path.write_text(f'"""Fake engine for {variant.name}."""\n{comment}{body}')
    return path


def render_marked(variant, path, header: str = "", memory_budget_gib=None, weights="any") -> Path:
    """The fake engine, marked as one with Triton kernels for slab variants (the warm-up's
    tests: it warms only engines with kernels)."""
    path = render_engine(variant, path, header)
    if variant.cache == "slab":
        path.write_text(path.read_text() + "\n# @triton.jit stands for a kernel here\n")
    return path
