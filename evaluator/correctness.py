"""The correctness gate: run an engine through the correctness traces and judge every row.

Each returned row is judged by a gate (`evaluator.gates`): by default the grader's rule,
`allclose(out.float().cpu(), ref.float().cpu(), atol, rtol)` against the reference computing that
request alone, batch 1, over its full token history, on the same device; or the noise gate.
Shape `[len(ids), vocab]`, dtype float32, the device, and "earlier logits are not overwritten by
later calls" are checked whatever the gate.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from evaluator.case_rows import CaseRows, case_rows
from evaluator.correctness_traces import public_correctness, stress
from evaluator.gates import CaseJudge, CheckFailed, CourseGate, Gate, PreparedGate
from evaluator.traces import materialize

log = logging.getLogger(__name__)

CASES = ("public", "stress")
PUBLIC_TOKEN_SEED = 7  # the contract's seed for the public sequence (plus `seed`)

__all__ = ["CASES", "CheckFailed", "PreparedCheck", "check_engine", "check_prepared"]


def _case_trace(case: str, config: dict, seed: int, stress_positions: int | None = None):
    """A case's trace and token seed; `stress_positions` caps where the stress case's longest
    request ends (default: the config's max_position_embeddings)."""
    if case == "public":
        return public_correctness(), PUBLIC_TOKEN_SEED + seed
    if case == "stress":
        most = config["max_position_embeddings"]
        if stress_positions is not None:
            most = min(most, stress_positions)
        return stress({**config, "max_position_embeddings": most}, seed), seed
    raise ValueError(f"unknown correctness case {case!r}; known: {', '.join(CASES)}")


def _same_device(actual: torch.device, wanted: torch.device) -> bool:
    return actual.type == wanted.type and (wanted.index is None or actual.index == wanted.index)


class _CaseRun:
    """The state of one case: the engine's kept outputs, the judge and the step count."""

    def __init__(self, judge: CaseJudge, rows: CaseRows, vocab: int, device: torch.device):
        self.judge, self.rows, self.vocab, self.device = judge, rows, vocab, device
        self.kept: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        self.steps = 0

    def check_kept(self, after: str) -> None:
        """Every logits tensor returned so far must still hold what it held when returned."""
        for where, out, copy in self.kept:
            if not torch.equal(out, copy):
                raise CheckFailed(
                    f"logits returned by {where} changed after {after} "
                    "(output aliases a buffer the engine reuses)"
                )

    def check_logits(self, step: int, where: str, ids: list[int], out) -> None:
        if not isinstance(out, torch.Tensor):
            raise CheckFailed(f"{where}: returned {type(out).__name__}, not a tensor")
        if tuple(out.shape) != (len(ids), self.vocab):
            raise CheckFailed(f"{where}: shape {list(out.shape)} != [{len(ids)}, {self.vocab}]")
        if out.dtype != torch.float32:
            raise CheckFailed(f"{where}: dtype {out.dtype} != torch.float32")
        if not _same_device(out.device, self.device):
            raise CheckFailed(f"{where}: logits on {out.device}, engine device is {self.device}")
        self.judge.check(step, where, self.rows.steps[step], out.float().cpu())
        self.steps += 1
        self.kept.append((where, out, out.detach().clone()))

    def run_call(self, engine, step: int, call: tuple) -> None:
        kind, ids = call[0], call[1]
        where = f"step {step} ({kind} ids={_short(ids)})"
        try:
            out = getattr(engine, kind)(list(ids), *call[2:])
        except Exception as exc:
            raise CheckFailed(f"{where}: engine raised {type(exc).__name__}: {exc}") from exc
        self.check_kept(after=where)
        if kind != "remove":
            self.check_logits(step, where, ids, out)


def _short(ids: list[int], limit: int = 6) -> str:
    text = ",".join(str(i) for i in ids[:limit])
    return f"[{text}{',...' if len(ids) > limit else ''}] ({len(ids)})"


@dataclass
class PreparedCheck:
    """What a check compares with, built once: reuse it to check several engines."""

    gate: Gate
    config: dict
    weight_dir: str
    device: torch.device
    calls: dict[str, list]  # case -> materialized calls
    rows: dict[str, CaseRows]
    judges: PreparedGate


def prepare_check(
    gate: Gate,
    config: dict,
    weight_dir: str | os.PathLike,
    device: str | torch.device,
    cases: tuple[str, ...] | list[str] = CASES,
    seed: int = 0,
    stress_positions: int | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> PreparedCheck:
    """Materialize the cases' calls and let the gate build its references (its noise
    measurement kept in `cache_dir`, when given)."""
    device = torch.device(device)
    calls, rows = {}, {}
    for case in cases:
        trace, token_seed = _case_trace(case, config, seed, stress_positions)
        calls[case] = materialize(trace, int(config["vocab_size"]), device, token_seed)
        rows[case] = case_rows(calls[case])
    start = time.perf_counter()
    judges = gate.prepare(config, str(weight_dir), device, rows, cache_dir=cache_dir)
    log.info("%s gate prepared in %.1f s", gate.name, time.perf_counter() - start)
    return PreparedCheck(gate, config, str(weight_dir), device, calls, rows, judges)


def check_prepared(create_engine: Callable, prepared: PreparedCheck) -> dict[str, dict]:
    """Run each case on a fresh engine from `create_engine(config, weight_dir, device)`."""
    p = prepared
    vocab = int(p.config["vocab_size"])
    results: dict[str, dict] = {}
    for case, calls in p.calls.items():
        run = _CaseRun(p.judges.judge(case), p.rows[case], vocab, p.device)
        failure = None
        start = time.perf_counter()
        with torch.no_grad():
            try:
                engine = create_engine(p.config, p.weight_dir, str(p.device))
            except Exception as exc:
                failure = f"create_engine raised {type(exc).__name__}: {exc}"
            else:
                try:
                    for step, call in enumerate(calls):
                        run.run_call(engine, step, call)
                except CheckFailed as exc:
                    failure = str(exc)
                del engine
        numbers = run.judge.summary()
        results[case] = {
            "passed": failure is None,
            "max_abs_err": numbers.pop("max_abs_err"),
            "tol_share": numbers.pop("tol_share"),
            "steps": run.steps,
            "failure": failure,
            "seconds": round(time.perf_counter() - start, 3),
            "gate": p.gate.name,
            **numbers,
        }
        log.info("case %s: %s", case, "passed" if failure is None else f"FAILED: {failure}")
    p.judges.keep()
    return results


def check_engine(
    create_engine: Callable,
    config: dict,
    weight_dir: str | os.PathLike,
    device: str | torch.device,
    atol: float = 1e-2,
    rtol: float = 1e-2,
    cases: tuple[str, ...] | list[str] = CASES,
    seed: int = 0,
    gate: Gate | None = None,
    stress_positions: int | None = None,
) -> dict[str, dict]:
    """Per case `{"passed", "max_abs_err", "tol_share", "steps", "failure", "seconds", "gate",
    "noise", "noise_share", "greedy_checked", "greedy_agreed"}`.

    `gate`: `CourseGate(atol, rtol)` when None (the grader's check); a given gate carries its own
    atol/rtol, and `atol`/`rtol` here must then be left as they are or agree with it.
    `tol_share` is the max over checked elements of |d| / (atol + rtol * |ref|) against the
    same-dtype reference: the course's rule passes at <= 1. `noise_share` is the max over rows of
    the error against the precise reference / (multiple x the row's noise): the noise gate passes
    at <= 1 (None when the gate measured no noise). `max_abs_err` is against the reference the
    gate judges by. A case stops at its first failure; `failure` names the step and op (None on a
    pass). Each case gets a fresh engine from `create_engine(config, weight_dir, device)`.
    """
    if gate is None:
        gate = CourseGate(atol, rtol)
    elif (atol, rtol) not in ((1e-2, 1e-2), (gate.atol, gate.rtol)):
        raise ValueError(f"atol/rtol {atol}/{rtol} disagree with the gate's {gate.to_dict()}")
    prepared = prepare_check(gate, config, weight_dir, device, cases, seed, stress_positions)
    return check_prepared(create_engine, prepared)
