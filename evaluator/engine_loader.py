"""Load an engine file the way the grader does (`spec_from_file_location`), and the model config.

Each load gets its own module name, so two engines (or two versions of one file) can live in one
process. Errors are `EngineLoadError` with a one-line reason, for the command-line tools.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
from pathlib import Path
from types import ModuleType

CONFIG_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)

# the course's model.pt, and the files transformers loads a folder from
WEIGHT_SUFFIXES = (".pt", ".safetensors", ".bin")

_load_count = itertools.count()


class EngineLoadError(ValueError):
    """An engine file or model config that cannot be used; the message is one line."""


def load_engine_module(path: str | os.PathLike) -> ModuleType:
    """Import the file at `path` as a fresh module; it must define `create_engine`."""
    path = Path(path).resolve()
    if not path.is_file():
        raise EngineLoadError(f"engine file not found: {path}")
    name = f"_engine_{path.stem}_{next(_load_count)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise EngineLoadError(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Not registered in sys.modules: the grader's import does not do it either, and an engine
    # that needs it (string annotations on dataclasses, pickling) must fail here, not there.
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise EngineLoadError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    if not callable(getattr(module, "create_engine", None)):
        raise EngineLoadError(f"{path} defines no create_engine function")
    return module


def load_model_config(path: str | os.PathLike) -> dict:
    """The parsed model config, checked for the keys every engine needs."""
    path = Path(path)
    try:
        config = json.loads(path.read_text())
    except OSError as exc:
        raise EngineLoadError(f"cannot read model config {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise EngineLoadError(f"model config {path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise EngineLoadError(f"model config {path} is not a JSON object")
    bad = [k for k in CONFIG_KEYS if not isinstance(config.get(k), int) or config[k] < 1]
    if bad:
        raise EngineLoadError(f"model config {path}: missing or invalid {', '.join(bad)}")
    return config


def default_target_paths(repo_root: Path) -> tuple[Path, Path]:
    """`/target/...` when the grading machine has it, else the public copy under `target/`."""
    for root in (Path("/target"), repo_root / "target"):
        if (root / "model_config.json").is_file():
            return root / "model_config.json", root / "weights"
    return repo_root / "target" / "model_config.json", repo_root / "target" / "weights"


def check_weight_dir(weight_dir: str | os.PathLike) -> str:
    """`weight_dir` as a string when it holds weights the judge reads: the course's `model.pt`,
    or a Hugging Face folder's safetensors or `.bin` files."""
    path = Path(weight_dir)
    if not path.exists():
        raise EngineLoadError(f"no weights: {path} does not exist")
    if path.is_file():
        path = path.parent
    found = [f.name for f in path.iterdir() if f.is_file() and f.suffix in WEIGHT_SUFFIXES]
    if not found:
        raise EngineLoadError(
            f"no weights in {path}: expected the course's model.pt or a Hugging Face folder's "
            f"{', '.join('*' + s for s in WEIGHT_SUFFIXES[1:])} files"
        )
    return str(weight_dir)


class OneLineParser(argparse.ArgumentParser):
    """A command line argparse refuses is one line, as every user error is (not the usage), and
    a flag is never guessed from its start (`--budget-minute` is refused, not `--budget-minutes`);
    its subcommands' parsers are of this class too."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str):
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")


def out_of_range(value, least, inclusive: bool) -> bool:
    """A flag's number that is not finite or below `least` (or at it, unless `inclusive`)."""
    return not (math.isfinite(value) and (value > least or inclusive and value == least))


def check_cli(args, positive=(), at_least=()) -> None:
    """The evaluators' flags before anything runs, EngineLoadError naming the first that is
    wrong: --device a torch device, --json a file path in a folder that exists, each flag of
    `positive` (name, as argparse stores it) > 0 and of `at_least` ((name, least)) >= least."""
    import torch

    try:
        torch.device(args.device)
    except RuntimeError:
        raise EngineLoadError(
            f"--device must be cpu, cuda or cuda:N, got {args.device!r}"
        ) from None
    for name, least, inclusive in [(n, 0, False) for n in positive] + [
        (n, m, True) for n, m in at_least
    ]:
        if (value := getattr(args, name)) is not None and out_of_range(value, least, inclusive):
            flag, sign = "--" + name.replace("_", "-"), ">=" if inclusive else ">"
            raise EngineLoadError(f"{flag} must be {sign} {least}, got {value}")
    if args.json_path:
        path = Path(args.json_path)
        if path.is_dir() or not path.parent.is_dir():
            raise EngineLoadError(f"--json {path}: give a file path in a folder that exists")
