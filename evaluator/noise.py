"""The model dtype's own rounding noise on a case's rows: the reference computed in the model's
dtype against the same reference in float64 on the CPU (float32 with TF32 off on CUDA), row by
row. The noise gate measures an engine's error in these units; docs/CORRECTNESS_GATE.md says why.

Needs both references once per case (one forward pass per request life, see `case_rows`), held
one at a time; what is kept is rows of logits on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import torch

from evaluator.case_rows import CaseRows, reference_rows
from evaluator.reference_model import is_course_format, load_reference

# Row noise is heavy-tailed where attention is sharp: an honest engine's worst row reached 3.5x
# the median row noise of the reference's, 2.2x its 90th percentile (docs/CORRECTNESS_GATE.md).
FLOOR_QUANTILE = 0.9


def precise_dtype_for(model_dtype: torch.dtype, device: str | torch.device) -> torch.dtype:
    """float64 on the CPU (cheap there) and for a float32 model (float32 against itself has no
    noise to measure); float32 on CUDA, where float64 is slow and float32 is already ~2**13
    times finer than float16 and ~2**16 times finer than bfloat16."""
    if torch.device(device).type != "cuda" or model_dtype == torch.float32:
        return torch.float64
    return torch.float32


@dataclass(frozen=True)
class CaseNoise:
    """Per call index: the precise reference's rows `[n, vocab]` (float64, CPU), the model-dtype
    reference's rows (float64 copies) and each row's noise `max |model - precise|` `[n]`."""

    precise: dict[int, torch.Tensor]
    model: dict[int, torch.Tensor]
    row_noise: dict[int, torch.Tensor]
    floor: float  # FLOOR_QUANTILE of the case's row noise
    resolution: float  # the model dtype's machine epsilon

    def allowance(self, step: int) -> torch.Tensor:
        """The noise each row of call `step` is measured in: its own noise, but never less than
        the case's floor (a row that happens to round well must not fail an honest engine that
        rounds it as badly as the case's other rows) nor one rounding step of its largest logit."""
        one_step = self.precise[step].abs().amax(dim=-1) * self.resolution
        return torch.maximum(self.row_noise[step], one_step).clamp(min=self.floor)


def measure_noise(
    config: dict,
    weight_dir: str | os.PathLike,
    device: str | torch.device,
    model_dtype: torch.dtype,
    rows_by_case: dict[str, CaseRows],
    cache_dir: str | os.PathLike | None = None,
) -> dict[str, CaseNoise]:
    """The noise of `model_dtype` on every case's rows, computed on `device`. `cache_dir`: kept
    there and read back under a key of everything it depends on (the config, the weight files,
    the device, torch, the dtype, the rows): a search's trials measure it once."""
    path = None
    if cache_dir is not None:
        key = noise_key(config, weight_dir, device, model_dtype, rows_by_case)
        path = Path(cache_dir) / f"noise-{key}.pt"
        if path.is_file():
            try:
                return _load(path)
            except Exception:  # a torn or foreign file: measure again
                pass
    out = _measure(config, weight_dir, device, model_dtype, rows_by_case)
    if path is not None:
        save_whole({case: asdict(noise) for case, noise in out.items()}, path)
    return out


def save_whole(data, path: Path) -> None:
    """`torch.save` through a file of this process's own, renamed over `path`: a reader never
    sees half a file; processes side by side write the same data, the last one's stays."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(f".{os.getpid()}.part")
    torch.save(data, part)
    os.replace(part, path)


def noise_key(config, weight_dir, device, model_dtype, rows_by_case) -> str:
    device = torch.device(device)
    h = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    for f in sorted(Path(weight_dir).iterdir()):
        if f.is_file():
            stat = f.stat()
            h.update(f"{f.name} {stat.st_size} {stat.st_mtime_ns}".encode())
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    h.update(f"{device.type} {gpu} {torch.__version__} {model_dtype}".encode())
    if not is_course_format(weight_dir):  # the judge is transformers' model: its version too
        try:
            h.update(f"transformers {metadata.version('transformers')}".encode())
        except metadata.PackageNotFoundError:  # no judge: load_reference says so
            pass
    for case, rows in sorted(rows_by_case.items()):
        h.update(f"{case} {sorted(rows.steps.items())}".encode())
        for life in rows.lives:
            h.update(life.cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _load(path: Path) -> dict[str, CaseNoise]:
    data = torch.load(path, map_location="cpu", weights_only=True)
    return {case: CaseNoise(**fields) for case, fields in data.items()}


def _measure(config, weight_dir, device, model_dtype, rows_by_case) -> dict[str, CaseNoise]:
    computed = []
    for dtype in (precise_dtype_for(model_dtype, device), model_dtype):
        model = load_reference(config, weight_dir, device, dtype)
        computed.append({case: reference_rows(model, r) for case, r in rows_by_case.items()})
        del model  # one model in memory at a time
    precise_rows, model_rows = computed
    out = {}
    for case in rows_by_case:
        precise, model = precise_rows[case], model_rows[case]
        row_noise = {s: (model[s] - precise[s]).abs().amax(dim=-1) for s in precise}
        everything = torch.cat(list(row_noise.values())) if row_noise else torch.zeros(1)
        out[case] = CaseNoise(
            precise,
            model,
            row_noise,
            floor=torch.quantile(everything, FLOOR_QUANTILE).item(),
            resolution=torch.finfo(model_dtype).eps,
        )
    return out


class NoiseNumbers:
    """An engine's rows against a case's noise: the error in units of `multiple` x each row's
    allowance, the greedy tokens the precise reference's margin decides, and whether the row can
    be judged at all; the worst share and the greedy counts accumulate over the case."""

    def __init__(self, noise: CaseNoise, multiple: float, greedy_margin: float):
        self.noise, self.multiple, self.greedy_margin = noise, multiple, greedy_margin
        self.noise_share = 0.0
        self.greedy_checked = self.greedy_agreed = 0

    def rows(self, step: int, got: torch.Tensor) -> list[dict]:
        precise, allowance = self.noise.precise[step], self.noise.allowance(step)
        got = got.double()
        err = (got - precise).abs().nan_to_num(nan=float("inf")).amax(dim=-1)
        top2 = precise.topk(2, dim=-1)
        margin = top2.values[:, 0] - top2.values[:, 1]
        decided = margin > self.greedy_margin * allowance
        agrees = got.argmax(dim=-1) == top2.indices[:, 0]
        # A constant row (the reference's mean everywhere) must fail: past this the model dtype
        # cannot tell an engine from nonsense, so the row is not judged as a pass.
        spread = (precise - precise.mean(dim=-1, keepdim=True)).abs().amax(dim=-1)
        judgeable = allowance.isfinite() & (self.multiple * allowance < spread)
        share = err / (self.multiple * allowance)
        self.noise_share = max(self.noise_share, share.max().item())
        self.greedy_checked += int(decided.sum())
        self.greedy_agreed += int((decided & agrees).sum())
        return [
            {
                "err": err[i].item(),
                "share": share[i].item(),
                "allowance": allowance[i].item(),
                "margin": margin[i].item(),
                "decided": bool(decided[i]),
                "agrees": bool(agrees[i]),
                "got_token": int(got[i].argmax()),
                "token": int(top2.indices[i, 0]),
                "spread": spread[i].item(),
                "judgeable": bool(judgeable[i]),
            }
            for i in range(len(got))
        ]

    def summary(self) -> dict:
        return {
            "noise": self.noise.floor,
            "noise_share": self.noise_share,
            "greedy_checked": self.greedy_checked,
            "greedy_agreed": self.greedy_agreed,
        }
