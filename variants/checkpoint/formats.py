"""Weight files into one state dict: the course `model.pt`, `model.safetensors`, sharded
safetensors with `model.safetensors.index.json`, and PyTorch `.bin` (single or sharded).

Pickles are read only with `weights_only=True` (tensors, no code). `safetensors` is imported only
when such a file is read, so an engine that loads `model.pt` imports nothing but torch."""

import json
import os
from dataclasses import dataclass

import torch

# The file a directory is read from, first match wins; several at once is a model exported
# twice (HF writes safetensors and often keeps a .bin), and safetensors needs no unpickling.
WEIGHT_FILE_NAMES = (
    "model.pt",
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
WEIGHT_FILE_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")


@dataclass
class Checkpoint:
    state: dict  # name -> CPU tensor, names as stored in the files
    path: str  # the weight file or index that was read


def find_weight_file(weight_dir) -> str:
    """The file to read: `weight_dir` itself when it is a file, else the first standard name,
    else the only file with a weight suffix."""
    weight_dir = os.fspath(weight_dir)
    if os.path.isfile(weight_dir):
        return weight_dir
    if not os.path.isdir(weight_dir):
        raise FileNotFoundError(f"no weights: {weight_dir} does not exist")
    for name in WEIGHT_FILE_NAMES:
        path = os.path.join(weight_dir, name)
        if os.path.isfile(path):
            return path
    files = sorted(os.listdir(weight_dir))
    candidates = [
        n
        for n in files
        if n.endswith(WEIGHT_FILE_SUFFIXES) and os.path.isfile(os.path.join(weight_dir, n))
    ]
    if len(candidates) == 1:
        return os.path.join(weight_dir, candidates[0])
    if candidates:
        raise ValueError(
            f"no weights in {weight_dir}: none of {', '.join(WEIGHT_FILE_NAMES)}, and several "
            f"candidates {candidates}; keep one or add an index json"
        )
    shown = ", ".join(files[:8]) + (", ..." if len(files) > 8 else "") if files else "nothing"
    raise FileNotFoundError(
        f"no weights in {weight_dir}: expected one of {', '.join(WEIGHT_FILE_NAMES)}; found {shown}"
    )


def read_pickled_weights(path: str) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickles that need more than tensors are refused on purpose
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(
            f"{path} is not a plain tensor state dict: torch.load(weights_only=True) "
            f"refused it ({reason})"
        ) from exc
    return state


def read_safetensors_weights(path: str) -> dict:
    try:
        from safetensors.torch import load_file
    except ImportError as exc:
        raise ImportError(
            f"{path} is a safetensors file and the `safetensors` package is not installed: "
            "pip install safetensors, or save the state dict as model.pt with torch.save"
        ) from exc
    try:
        return load_file(path, device="cpu")
    except Exception as exc:
        raise ValueError(f"{path} is not a readable safetensors file ({exc})") from exc


def read_sharded_weights(index_path: str) -> dict:
    """Every shard named by a Hugging Face index json, each read once."""
    try:
        with open(index_path) as f:
            weight_map = json.load(f).get("weight_map")
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{index_path} is not a weight index json ({exc})") from exc
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index_path} has no weight_map naming the shards")
    folder = os.path.dirname(index_path)
    state: dict = {}
    for shard in sorted(set(weight_map.values())):
        if not isinstance(shard, str) or os.path.basename(shard) != shard:
            raise ValueError(f"{index_path}: shard {shard!r} is not a file name in {folder}")
        path = os.path.join(folder, shard)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{index_path} names shard {shard}, which does not exist")
        tensors = read_weight_file(path)
        lacking = [k for k, s in weight_map.items() if s == shard and k not in tensors]
        if lacking:
            raise ValueError(f"{index_path} maps {lacking[0]!r} to {shard}, which lacks it")
        state.update(tensors)
    return state


def read_weight_file(path: str) -> dict:
    if path.endswith(".index.json"):
        state = read_sharded_weights(path)
    elif path.endswith(".safetensors"):
        state = read_safetensors_weights(path)
    else:
        state = read_pickled_weights(path)
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}, expected a state dict")
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"{path}: entry {key!r} is a {type(value).__name__}, expected a tensor "
                "(a plain state dict of name -> tensor)"
            )
    return state


def read_checkpoint(weight_dir) -> Checkpoint:
    path = find_weight_file(weight_dir)
    return Checkpoint(state=read_weight_file(path), path=path)
