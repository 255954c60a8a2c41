"""Which model to tune, checked before anything runs, and what identifies it.

The target: `/target` on the grading machine; else the embedded default, `target/` (its toy
weights generated into `target/weights/` when missing: the only weights this project ever
writes); else the user's `--model-config` (a Hugging Face folder's config.json, or the course's
model_config.json) with `--weight-dir` (default: the config's folder). A user's folder is read,
never written. The pre-flight validates the config, finds the weights and checks them key by key
against the config from the files' headers (no tensor is read), within seconds; any problem is a
`TargetError` whose one line names the cause and the fix.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from evaluator.engine_loader import EngineLoadError, default_target_paths, load_model_config
from search.errors import UserError
from search.trial import REPO_ROOT
from variants.checkpoint.formats import Checkpoint, find_weight_file
from variants.spec import ModelSpec

log = logging.getLogger(__name__)

# safetensors' dtype names
_ST_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


class TargetError(UserError):
    """A model the job cannot use; the message is one line: the cause and the fix."""


# What the written engine's weight reader takes, by `Target.weights_format`.
READERS = {
    "course": "a course-layout model.pt only (its one reader: variants/checkpoint/course_file.py)",
    "any": "any weight format (variants/checkpoint/reader.py)",
}


@dataclass
class Target:
    config_path: Path
    weight_dir: Path
    config: dict
    notes: list[str] = field(default_factory=list)
    embedded: bool = False  # the project's own target/ (toy weights), not a user's folder
    course: bool = False  # the course's model: /target or target/
    weights_file: str = ""
    weights_format: str = "any"  # "course": a course-layout model.pt (the engine's reader)
    fingerprint: str = ""  # of the weight files' contents (sampled), see `weights_fingerprint`

    def describe(self) -> dict:
        return {
            "model_config": str(self.config_path),
            "weight_dir": str(self.weight_dir),
            "weights": f"{self.weights_file} (fingerprint {self.fingerprint})",
            "engine reads": READERS[self.weights_format],
            "notes": "; ".join(self.notes) or "-",
            "config": self.config,
        }


def resolve_target(model_config: str | None, weight_dir: str | None) -> Target:
    """The target of a run, pre-flighted (module docstring); raises TargetError."""
    default_config, default_weights = default_target_paths(REPO_ROOT)
    embedded_config = (REPO_ROOT / "target" / "model_config.json").resolve()
    config_path = Path(model_config) if model_config else default_config
    if weight_dir:
        weights = Path(weight_dir)
    elif model_config:
        weights = config_path.parent  # a Hugging Face folder holds both
    else:
        weights = default_weights
    course = model_config is None or config_path.resolve() == embedded_config
    embedded = (
        weight_dir is None
        and model_config is None
        and default_config.resolve() == (embedded_config)
    )
    config = _read_config(config_path)
    notes = []
    if model_config is None:
        notes.append(f"model config found at {config_path}")
    if embedded and not _has_weights(weights):
        from evaluator.toy_weights import save_toy_weights

        save_toy_weights(config, weights / "model.pt", seed=1234)
        notes.append(f"generated the public toy weights (seed 1234) into {weights}")
        log.info("generated toy weights into %s", weights)
    target = Target(config_path.resolve(), weights.resolve(), config, notes, embedded, course)
    check_weights(target)
    target.fingerprint = weights_fingerprint(target.weights_file)
    return target


def _read_config(path: Path) -> dict:
    try:
        config = load_model_config(path)
        ModelSpec.from_config(config)
    except EngineLoadError as exc:
        raise TargetError(f"{exc}; pass --model-config with a model's config.json") from None
    except (ValueError, TypeError) as exc:
        raise TargetError(f"model config {path}: {exc}; fix the config") from None
    return config


def _has_weights(folder: Path) -> bool:
    try:
        find_weight_file(folder)
    except FileNotFoundError:
        return False
    return True


def check_weights(target: Target) -> None:
    """The weights found and their names and shapes checked against the config, from the files'
    headers; fills in `target.weights_file` and `target.weights_format`."""
    from variants.checkpoint.reader import course_layout, weights_format

    folder = target.weight_dir
    try:
        path = find_weight_file(folder)
    except (FileNotFoundError, ValueError) as exc:
        fix = "pass --weight-dir with the model's weights (model.pt, safetensors or .bin)"
        raise TargetError(f"{exc}; {fix}") from None
    target.weights_file = path
    spec = ModelSpec.from_config(target.config)
    shapes = stored_shapes(path)
    target.weights_format = weights_format(spec, path, shapes)
    try:
        course_layout(spec, Checkpoint(dict(shapes), path))
    except (KeyError, ValueError) as exc:
        reason = exc.args[0] if exc.args else str(exc)
        raise TargetError(
            f"the weights in {folder} do not fit {target.config_path.name}: {reason}; pass the "
            "config and the weights of one model"
        ) from None


def stored_shapes(path: str) -> dict:
    """Every stored tensor of a weight file (or a sharded index's shards) as a meta tensor of
    its shape and dtype: the headers read, not the data."""
    if path.endswith(".index.json"):
        import json

        folder = Path(path).parent
        try:
            shards = sorted(set(json.loads(Path(path).read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise TargetError(f"{path} is not a weight index json ({exc})") from None
        state: dict = {}
        for shard in shards:
            state.update(stored_shapes(str(folder / shard)))
        return state
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
        raise TargetError(f"cannot read the weights in {path}: {exc}") from None
    if not isinstance(state, dict):
        raise TargetError(f"{path} holds a {type(state).__name__}, expected a state dict")
    return {
        k: torch.empty(v.shape, dtype=v.dtype, device="meta") if isinstance(v, torch.Tensor) else v
        for k, v in state.items()
    }


def weights_fingerprint(path: str, chunk: int = 4 << 20) -> str:
    """A short hash of the weight files' sizes and contents: their first, middle and last 4 MiB
    (other weights of one shape differ there; a whole file's hash would cost seconds a GB)."""
    files = [Path(path)]
    if path.endswith(".index.json"):
        import json

        names = sorted(set(json.loads(Path(path).read_text())["weight_map"].values()))
        files = [Path(path).parent / n for n in names]
    digest = hashlib.blake2b(digest_size=8)
    for f in files:
        size = f.stat().st_size
        digest.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            for at in sorted({0, max(0, size // 2 - chunk // 2), max(0, size - chunk)}):
                fh.seek(at)
                digest.update(fh.read(chunk))
    return digest.hexdigest()
