"""The model pre-flight, before anything is built: the target's config validated, its weights
found and checked key by key against it from the files' headers (no tensor is read), and their
fingerprint, within seconds; any problem is a `TargetError` whose one line names the cause and the
fix. The search, the shape sweep and their commands resolve their model here.

The target: `/target` on the grading machine; else the embedded default, `target/` (its toy
weights generated into `target/weights/` when missing: the only weights this project ever writes);
else the user's `--model-config` (a Hugging Face folder's config.json, or the course's
model_config.json) with `--weight-dir` (default: the config's folder). A user's folder is read,
never written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from evaluator.engine_loader import EngineLoadError, default_target_paths, load_model_config
from evaluator.reference_model import NoReference, check_judgeable
from evaluator.toy_weights import save_toy_weights
from variants.checkpoint.course_config import course_keys as course_only
from variants.checkpoint.formats import Checkpoint, find_weight_file
from variants.checkpoint.hf_config import NotComputed, course_keys
from variants.checkpoint.hf_llama import course_layout
from variants.checkpoint.reader import weights_format
from variants.spec import SIZE_KEYS, ModelSpec

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]

# safetensors' dtype names
_ST_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip
# What the written engine's config and weight readers take, by `Target.weights_format`.
READERS = {
    "course": "the course's config keys and a course-layout model.pt only (its readers: "
    "variants/checkpoint/course_config.py, course_file.py)",
    "safetensors": "Hugging Face configs and one safetensors file only "
    "(variants/checkpoint/hf_config.py, safetensors_file.py)",
    "any": "Hugging Face configs and any weight format (variants/checkpoint/hf_config.py, "
    "reader.py)",
}


class TargetError(ValueError):
    """A model the job cannot use; the message is one line: the cause and the fix."""


@dataclass
class Target:
    config_path: Path
    weight_dir: Path
    config: dict
    notes: list[str] = field(default_factory=list)
    weights_file: str = ""
    # the engine's readers (READERS): "course" (the course's config keys and a course-layout
    # model.pt), "safetensors" (one safetensors file) or "any"
    weights_format: str = "any"
    fingerprint: str = ""  # of the weight files' contents (sampled), see `weights_fingerprint`
    numel: int = 0  # the stored tensors' elements
    judge: str = ""  # what the gate's reference is (evaluator.reference_model.check_judgeable)

    def describe(self) -> dict:
        return {
            "model_config": str(self.config_path),
            "weight_dir": str(self.weight_dir),
            "weights": f"{self.weights_file} (fingerprint {self.fingerprint})",
            "engine reads": READERS[self.weights_format],
            "reference": self.judge,
            "notes": "; ".join(self.notes) or "-",
            "config": self.config,
        }


def reads_as_course(config: dict) -> bool:
    """Whether the course's own config reader (course_config.py) reads `config` as the library's
    does: it holds the course's keys alone and none needs filling in. An engine written for such
    a target may carry that reader alone (`Target.weights_format`)."""
    try:
        return course_only(config) == course_keys(config)
    except ValueError:
        return False


def resolve_target(model_config: str | None, weight_dir: str | None) -> Target:
    """The target of a run, pre-flighted; raises TargetError."""
    default_config, default_weights = default_target_paths(REPO_ROOT)
    config_path = Path(model_config) if model_config else default_config
    # a Hugging Face folder holds both the config and the weights
    weights = Path(weight_dir or (config_path.parent if model_config else default_weights))
    if weights.is_file():
        raise TargetError(f"--weight-dir {weights} is a file: pass its folder, {weights.parent}")
    embedded = default_config.resolve() == (REPO_ROOT / "target" / "model_config.json").resolve()
    config = _read_config(config_path)
    notes = [f"model config found at {config_path}"] if model_config is None else []
    if model_config is None and weight_dir is None and embedded and not _has_weights(weights):
        save_toy_weights(config, weights / "model.pt", seed=1234)
        notes.append(f"generated the public toy weights (seed 1234) into {weights}")
        log.info("generated toy weights into %s", weights)
    target = Target(config_path.resolve(), weights.resolve(), config, notes)
    check_weights(target)
    try:
        target.judge = check_judgeable(config, target.weight_dir)
    except NoReference as exc:
        raise TargetError(str(exc)) from None
    target.fingerprint = weights_fingerprint(target.weights_file)
    return target


def _read_config(path: Path) -> dict:
    try:
        config = load_model_config(path)
        ModelSpec.from_config(config)
        _check_types(config)
    except EngineLoadError as exc:
        raise TargetError(f"{exc}; pass --model-config with a model's config.json") from None
    except NotComputed as exc:
        raise TargetError(
            f"model config {path}: {str(exc).removeprefix('model_config: ')}"
        ) from None
    except (ValueError, TypeError) as exc:
        raise TargetError(f"model config {path}: {exc}; fix the config") from None
    return config


def _check_types(config: dict) -> None:
    """Sizes are whole numbers and the norm's epsilon and RoPE's base positive numbers as the
    config gives them: "16" or 16.0 would read as 16 in ModelSpec and fail where a tool reads
    the config itself."""
    keys = course_keys(config)
    for key in SIZE_KEYS.values():
        if type(keys[key]) is not int:
            raise ValueError(f"{key} must be a whole number, got {keys[key]!r}")
    for key in ("rms_norm_eps", "rope_theta"):
        value = keys.get(key, 1.0)
        if type(value) not in (int, float) or not (math.isfinite(value) and value > 0):
            raise ValueError(f"{key} must be a positive number, got {value!r}")


def _has_weights(folder: Path) -> bool:
    try:
        return bool(find_weight_file(folder))
    except FileNotFoundError:
        return False


def check_weights(target: Target) -> None:
    """The weights found and their names and shapes checked against the config, from the files'
    headers; fills in `target.weights_file` and `target.weights_format` ("course" where the
    course's readers read the weights and the config as the library's do, "safetensors" for one
    safetensors file)."""
    try:
        path = find_weight_file(target.weight_dir)
    except (FileNotFoundError, ValueError) as exc:
        fix = "pass --weight-dir with the model's weights (model.pt, safetensors or .bin)"
        raise TargetError(f"{exc}; {fix}") from None
    target.weights_file = path
    spec = ModelSpec.from_config(target.config)
    shapes = stored_shapes(path)
    target.numel = sum(t.numel() for t in shapes.values() if isinstance(t, torch.Tensor))
    target.weights_format = weights_format(spec, path, shapes)
    if target.weights_format == "course" and not reads_as_course(target.config):
        target.weights_format = "any"  # the course's weights under another config's keys
    try:
        course_layout(spec, Checkpoint(dict(shapes), path))
    except (KeyError, ValueError) as exc:
        reason = exc.args[0] if exc.args else str(exc)
        raise TargetError(
            f"the weights in {target.weight_dir} do not fit {target.config_path.name}: {reason}; "
            "pass the config and the weights of one model"
        ) from None


def stored_shapes(path: str) -> dict:
    """Every stored tensor of a weight file (or a sharded index's shards) as a meta tensor of
    its shape and dtype: the headers read, not the data."""
    if path.endswith(".index.json"):
        try:
            shards = shard_files(path)
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise TargetError(f"{path} is not a weight index json ({exc})") from None
        return {k: v for shard in shards for k, v in stored_shapes(str(shard)).items()}
    try:
        if path.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(path, "pt") as f:
                slices = {k: f.get_slice(k) for k in f.keys()}  # noqa: SIM118
                return {
                    k: torch.empty(s.get_shape(), dtype=_ST_DTYPES[s.get_dtype()], device="meta")
                    for k, s in slices.items()
                }
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # a file of another kind, truncated or refused: say which
        text = str(exc).strip()  # its first sentence (torch's go on for lines)
        reason = text.splitlines()[0].split(". ")[0].rstrip(".") if text else repr(exc)
        raise TargetError(
            f"cannot read the weights in {path} ({reason}); re-export them, or pass --weight-dir "
            "with the model's weights"
        ) from None
    if not isinstance(state, dict):
        raise TargetError(f"{path} holds a {type(state).__name__}, expected a state dict")
    return {
        k: torch.empty(v.shape, dtype=v.dtype, device="meta") if isinstance(v, torch.Tensor) else v
        for k, v in state.items()
    }


def shard_files(index: str) -> list[Path]:
    """The files a sharded checkpoint's index json names, in order."""
    names = json.loads(Path(index).read_text())["weight_map"].values()
    return [Path(index).parent / name for name in sorted(set(names))]


def weights_fingerprint(path: str, chunk: int = 4 << 20) -> str:
    """A short hash of the weight files' sizes and contents: their first, middle and last 4 MiB
    (other weights of one shape differ there; a whole file's hash would cost seconds a GB)."""
    files = shard_files(path) if path.endswith(".index.json") else [Path(path)]
    digest = hashlib.blake2b(digest_size=8)
    for f in files:
        size = f.stat().st_size
        digest.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            for at in sorted({0, max(0, size // 2 - chunk // 2), max(0, size - chunk)}):
                fh.seek(at)
                digest.update(fh.read(chunk))
    return digest.hexdigest()
