"""The two correctness gates behind one interface.

- `CourseGate`: the grader's check, `allclose(atol, rtol)` against the reference in the same
  dtype, each row recomputed alone over its full history. For the course's float16 model.
- `NoiseGate`: the error against a float64 (CPU) or float32 (CUDA, no TF32) reference, in units
  of the model dtype's own rounding noise on the same row (`evaluator.noise`), and the greedy
  token wherever the reference's top-1 margin decides it. For every other model: in bfloat16, or
  float16 at 1B parameters, the reference's own rounding exceeds the course's fixed tolerance.
`check_engine(..., gate=...)` runs either; `evaluator.gate_choice.select_gate` says which one a
target gets. docs/CORRECTNESS_GATE.md has the calibration.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

import torch

from evaluator.case_rows import CaseRows, Row
from evaluator.noise import CaseNoise, NoiseNumbers, measure_noise, noise_key, save_whole
from evaluator.reference_model import compute_dtype_for, dtype_named, load_reference

# The calibrated multiple and greedy margin (docs/CORRECTNESS_GATE.md,
# experiments/calibrate_gate.py).
NOISE_MULTIPLE = 4.0
GREEDY_MARGIN = 2.0  # in noise units: above it even the model-dtype reference cannot flip a token


class CheckFailed(Exception):
    """One failed check; the message names the step and op."""


class CaseJudge(Protocol):
    def check(self, step: int, where: str, rows: list[Row], got: torch.Tensor) -> None:
        """Judge call `step`'s float32 CPU logits `got [len(rows), vocab]`; raise CheckFailed
        naming the first row that fails."""

    def summary(self) -> dict:
        """The case's numbers: max_abs_err, tol_share, noise, noise_share, greedy counts."""


class PreparedGate(Protocol):
    def judge(self, case: str) -> CaseJudge:
        """A fresh judge for one run of `case`."""

    def keep(self) -> None:
        """Store what the judges computed for the next check (where a cache folder was given)."""

    def fill(self) -> None:
        """Compute every row the cases check now (then `keep` stores them all), and let the
        reference model go."""


class Gate(Protocol):
    name: ClassVar[str]
    atol: float
    rtol: float

    def prepare(
        self, config, weight_dir, device, rows_by_case: dict, cache_dir=None
    ) -> PreparedGate:
        """Build what the gate compares with (references, noise) once, for every case; the
        noise measurement is kept in `cache_dir` (`measure_noise`)."""

    def to_dict(self) -> dict: ...


def _tol_share(got: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """Per row, max |d| / (atol + rtol |ref|): the course's allclose passes at <= 1."""
    share = (got - ref).abs() / (atol + rtol * ref.abs())
    return share.nan_to_num(nan=float("inf")).amax(dim=-1)


def _no_noise() -> dict:
    return {"noise": None, "noise_share": None, "greedy_checked": None, "greedy_agreed": None}


def _row_name(where: str, row: Row, i: int) -> str:
    return f"{where}: request {row.rid} (row {i}, length {row.position + 1})"


# --- the course's check -----------------------------------------------------------------------


@dataclass(frozen=True)
class CourseGate:
    """The grader's rule. With `measure_noise` the case also reports the noise gate's numbers
    (not enforced): the log can say how close an engine is in both units."""

    atol: float = 1e-2
    rtol: float = 1e-2
    measure_noise: bool = False
    name: ClassVar[str] = "course"

    def prepare(
        self, config, weight_dir, device, rows_by_case: dict, cache_dir=None
    ) -> CoursePrepared:
        noise = None
        if self.measure_noise:
            dtype = compute_dtype_for(config, device)
            noise = measure_noise(config, weight_dir, device, dtype, rows_by_case, cache_dir)
        prepared = CoursePrepared(self, (config, weight_dir, device), rows_by_case, noise)
        if cache_dir is not None:
            key = noise_key(config, weight_dir, device, "course reference", rows_by_case)
            prepared.load(Path(cache_dir) / f"reference-{key}.pt")
        return prepared

    def to_dict(self) -> dict:
        return {"name": self.name, **asdict(self)}


@dataclass
class CoursePrepared:
    """The same-dtype reference; each row's logits are computed on first use and kept, so the
    engines checked after the first one reuse them, and with a cache file (`load`, `keep`) the
    checks of other processes too. The model is loaded on the first row not kept."""

    gate: CourseGate
    model_args: tuple  # (config, weight_dir, device) of the reference (`load_reference`)
    rows_by_case: dict[str, CaseRows]
    noise: dict[str, CaseNoise] | None
    kept: dict = field(default_factory=dict)  # (case, life, position) -> float32 CPU logits
    path: Path | None = None
    stored: int = 0  # how many of `kept` the cache file holds
    model: object = None  # the reference, loaded on the first row not kept

    def reference(self, case: str, row: Row) -> torch.Tensor:
        """As the grader computes it: the request alone, batch 1, over its full history."""
        key = (case, row.life, row.position)
        if key not in self.kept:
            if self.model is None:
                self.model = load_reference(*self.model_args)
            history = self.rows_by_case[case].history(row)
            self.kept[key] = self.model.forward(history[None])[0, -1].float().cpu()
        return self.kept[key]

    def load(self, path: Path) -> None:
        """Take the rows a cache file holds (keyed by everything they depend on: `noise_key`)."""
        self.path = path
        try:
            rows = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # none yet, torn or foreign: computed again
            return
        self.kept.update({tuple(k): v for k, v in zip(rows["keys"], rows["logits"])})
        self.stored = len(self.kept)

    def fill(self) -> None:
        for case, rows in self.rows_by_case.items():
            for step_rows in rows.steps.values():
                for row in step_rows:
                    self.reference(case, row)
        self.model = None

    def keep(self) -> None:
        if self.path is None or len(self.kept) == self.stored:
            return
        keys = list(self.kept)
        rows = {"keys": [list(k) for k in keys], "logits": [self.kept[k] for k in keys]}
        save_whole(rows, self.path)
        self.stored = len(self.kept)

    def judge(self, case: str) -> CourseJudge:
        noise = None
        if self.noise is not None:
            noise = NoiseNumbers(self.noise[case], NOISE_MULTIPLE, GREEDY_MARGIN)
        return CourseJudge(self, case, noise)


class CourseJudge:
    def __init__(self, prepared: CoursePrepared, case: str, noise: NoiseNumbers | None):
        self.prepared, self.case, self.noise = prepared, case, noise
        self.max_abs_err = self.tol_share = 0.0

    def check(self, step: int, where: str, rows: list[Row], got: torch.Tensor) -> None:
        if self.noise is not None:
            self.noise.rows(step, got)  # reported, not enforced
        gate = self.prepared.gate
        for i, row in enumerate(rows):
            ref = self.prepared.reference(self.case, row)
            err = (got[i] - ref).abs().nan_to_num(nan=float("inf")).max().item()
            worst = _tol_share(got[i], ref, gate.atol, gate.rtol).item()
            self.max_abs_err = max(self.max_abs_err, err)
            self.tol_share = max(self.tol_share, worst)
            if not worst <= 1.0:
                raise CheckFailed(
                    f"{_row_name(where, row, i)} max |d| {err:.4g}, {worst:.3g}x the tolerance"
                )

    def summary(self) -> dict:
        numbers = self.noise.summary() if self.noise is not None else _no_noise()
        return {"max_abs_err": self.max_abs_err, "tol_share": self.tol_share, **numbers}


# --- the noise gate ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NoiseGate:
    """Pass when every row's max |engine - precise reference| <= `multiple` x the row's noise
    allowance (`CaseNoise.allowance`) and, where the precise reference's top-1 margin exceeds
    `greedy_margin` x that allowance, the engine's greedy token is the reference's.

    `dtype`: the model dtype whose noise is the unit (default: the contract's compute dtype for
    the device; name float16/bfloat16 to judge a CPU run in low precision). `atol`/`rtol` only
    express the error in the course's units too (`tol_share`, against the model-dtype reference).
    """

    multiple: float = NOISE_MULTIPLE
    greedy_margin: float = GREEDY_MARGIN
    dtype: str | None = None
    atol: float = 1e-2
    rtol: float = 1e-2
    name: ClassVar[str] = "noise"

    def model_dtype(self, config: dict, device) -> torch.dtype:
        return dtype_named(self.dtype) if self.dtype else compute_dtype_for(config, device)

    def prepare(
        self, config, weight_dir, device, rows_by_case: dict, cache_dir=None
    ) -> NoisePrepared:
        dtype = self.model_dtype(config, device)
        noise = measure_noise(config, weight_dir, device, dtype, rows_by_case, cache_dir)
        return NoisePrepared(self, noise)

    def to_dict(self) -> dict:
        return {"name": self.name, **asdict(self)}


@dataclass
class NoisePrepared:
    gate: NoiseGate
    noise: dict[str, CaseNoise]

    def judge(self, case: str) -> NoiseJudge:
        return NoiseJudge(self.gate, self.noise[case])

    def keep(self) -> None:
        """(The noise measurement was stored when it was made.)"""

    def fill(self) -> None:
        """(Measured whole when prepared.)"""


class NoiseJudge:
    def __init__(self, gate: NoiseGate, noise: CaseNoise):
        self.gate, self.noise = gate, noise
        self.numbers = NoiseNumbers(noise, gate.multiple, gate.greedy_margin)
        self.max_abs_err = self.tol_share = 0.0

    def check(self, step: int, where: str, rows: list[Row], got: torch.Tensor) -> None:
        g = self.gate
        tol = _tol_share(got.double(), self.noise.model[step], g.atol, g.rtol)
        self.tol_share = max(self.tol_share, tol.max().item())
        for i, (row, n) in enumerate(zip(rows, self.numbers.rows(step, got), strict=True)):
            self.max_abs_err = max(self.max_abs_err, n["err"])
            name = _row_name(where, row, i)
            if not n["judgeable"]:
                raise CheckFailed(
                    f"{name}: the model-dtype reference's noise {n['allowance']:.3g} is too "
                    f"large to judge ({g.multiple:g}x it reaches the logits' spread "
                    f"{n['spread']:.3g}); compute this model in a wider dtype"
                )
            if not n["share"] <= 1.0:
                raise CheckFailed(
                    f"{name} max |d| {n['err']:.4g} from the precise reference, "
                    f"{n['share'] * g.multiple:.3g}x the noise {n['allowance']:.3g} "
                    f"(limit {g.multiple:g}x)"
                )
            if n["decided"] and not n["agrees"]:
                raise CheckFailed(
                    f"{name} greedy token {n['got_token']} != {n['token']}, whose margin "
                    f"{n['margin']:.3g} is {n['margin'] / n['allowance']:.3g}x the noise "
                    f"{n['allowance']:.3g}"
                )

    def summary(self) -> dict:
        return {
            "max_abs_err": self.max_abs_err,
            "tol_share": self.tol_share,
            **self.numbers.summary(),
        }
