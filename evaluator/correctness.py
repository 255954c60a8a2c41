"""The correctness gate: run an engine through the correctness traces and compare every row.

Each returned row is compared with the reference model computing that request alone, batch 1,
over its full token history, on the same device, by the grader's rule
(`allclose(out.float().cpu(), ref.float().cpu(), atol, rtol)`). Shape `[len(ids), vocab]`, dtype
float32, the device, and "earlier logits are not overwritten by later calls" are checked as well.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import torch

from evaluator.correctness_traces import public_correctness, stress
from evaluator.reference_model import ReferenceModel
from evaluator.traces import materialize

log = logging.getLogger(__name__)

CASES = ("public", "stress")
PUBLIC_TOKEN_SEED = 7  # the contract's seed for the public sequence (plus `seed`)


class CheckFailed(Exception):
    """One failed check; the message names the step and op."""


def _case_trace(case: str, config: dict, seed: int):
    if case == "public":
        return public_correctness(), PUBLIC_TOKEN_SEED + seed
    if case == "stress":
        return stress(config, seed), seed
    raise ValueError(f"unknown correctness case {case!r}; known: {', '.join(CASES)}")


def _same_device(actual: torch.device, wanted: torch.device) -> bool:
    return actual.type == wanted.type and (wanted.index is None or actual.index == wanted.index)


class _CaseRun:
    """The state of one case: token histories, kept outputs, and the error statistics."""

    def __init__(self, ref: ReferenceModel, vocab: int, device: torch.device, atol, rtol):
        self.ref, self.vocab, self.device = ref, vocab, device
        self.atol, self.rtol = atol, rtol
        self.history: dict[int, torch.Tensor] = {}
        self.kept: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        self.max_abs_err = 0.0
        self.tol_share = 0.0
        self.steps = 0

    def check_kept(self, after: str) -> None:
        """Every logits tensor returned so far must still hold what it held when returned."""
        for where, out, copy in self.kept:
            if not torch.equal(out, copy):
                raise CheckFailed(
                    f"logits returned by {where} changed after {after} "
                    "(output aliases a buffer the engine reuses)"
                )

    def check_logits(self, where: str, ids: list[int], out) -> None:
        if not isinstance(out, torch.Tensor):
            raise CheckFailed(f"{where}: returned {type(out).__name__}, not a tensor")
        if tuple(out.shape) != (len(ids), self.vocab):
            raise CheckFailed(f"{where}: shape {list(out.shape)} != [{len(ids)}, {self.vocab}]")
        if out.dtype != torch.float32:
            raise CheckFailed(f"{where}: dtype {out.dtype} != torch.float32")
        if not _same_device(out.device, self.device):
            raise CheckFailed(f"{where}: logits on {out.device}, engine device is {self.device}")
        got = out.float().cpu()
        for row, rid in enumerate(ids):
            ref = self.ref.forward(self.history[rid][None])[0, -1].float().cpu()
            diff = (got[row] - ref).abs()
            share = (diff / (self.atol + self.rtol * ref.abs())).nan_to_num(nan=float("inf"))
            err, worst = diff.nan_to_num(nan=float("inf")).max().item(), share.max().item()
            self.max_abs_err = max(self.max_abs_err, err)
            self.tol_share = max(self.tol_share, worst)
            if not worst <= 1.0:
                raise CheckFailed(
                    f"{where}: request {rid} (row {row}, length {len(self.history[rid])}) "
                    f"max |d| {err:.4g}, {worst:.3g}x the tolerance"
                )
        self.steps += 1
        self.kept.append((where, out, out.detach().clone()))

    def run_call(self, engine, step: int, call: tuple) -> None:
        kind, ids = call[0], call[1]
        where = f"step {step} ({kind} ids={_short(ids)})"
        if kind == "prefill":
            for rid, tokens in zip(ids, call[2], strict=True):
                self.history[rid] = tokens.to(self.device).clone()
        elif kind == "decode":
            tokens = call[2].to(self.device)
            for row, rid in enumerate(ids):
                self.history[rid] = torch.cat([self.history[rid], tokens[row : row + 1]])
        else:
            for rid in ids:
                del self.history[rid]
        try:
            out = getattr(engine, kind)(list(ids), *call[2:])
        except Exception as exc:
            raise CheckFailed(f"{where}: engine raised {type(exc).__name__}: {exc}") from exc
        self.check_kept(after=where)
        if kind != "remove":
            self.check_logits(where, ids, out)


def _short(ids: list[int], limit: int = 6) -> str:
    text = ",".join(str(i) for i in ids[:limit])
    return f"[{text}{',...' if len(ids) > limit else ''}] ({len(ids)})"


def check_engine(
    create_engine: Callable,
    config: dict,
    weight_dir: str | os.PathLike,
    device: str | torch.device,
    atol: float = 1e-2,
    rtol: float = 1e-2,
    cases: tuple[str, ...] | list[str] = CASES,
    seed: int = 0,
) -> dict[str, dict]:
    """Per case `{"passed", "max_abs_err", "tol_share", "steps", "failure", "seconds"}`.

    `tol_share` is the max over checked elements of |d| / (atol + rtol * |ref|): passing means
    <= 1. A case stops at its first failure; `failure` names the step and op (None on a pass).
    Each case gets a fresh engine from `create_engine(config, weight_dir, device)`.
    """
    device = torch.device(device)
    ref = ReferenceModel(config, str(weight_dir), device)
    vocab = int(config["vocab_size"])
    results: dict[str, dict] = {}
    for case in cases:
        trace, token_seed = _case_trace(case, config, seed)
        calls = materialize(trace, vocab, device, token_seed)
        run = _CaseRun(ref, vocab, device, atol, rtol)
        failure = None
        start = time.perf_counter()
        with torch.no_grad():
            try:
                engine = create_engine(config, str(weight_dir), str(device))
            except Exception as exc:
                failure = f"create_engine raised {type(exc).__name__}: {exc}"
            else:
                try:
                    for step, call in enumerate(calls):
                        run.run_call(engine, step, call)
                except CheckFailed as exc:
                    failure = str(exc)
                del engine
        results[case] = {
            "passed": failure is None,
            "max_abs_err": run.max_abs_err,
            "tol_share": run.tol_share,
            "steps": run.steps,
            "failure": failure,
            "seconds": round(time.perf_counter() - start, 3),
        }
        log.info("case %s: %s", case, "passed" if failure is None else f"FAILED: {failure}")
    return results
