"""A real model cut down to carry: a Hugging Face folder's first layers and first vocabulary rows,
in a dtype, as a new Hugging Face folder (model.safetensors, config.json, the tokenizer files).

    python scripts/trim_model.py ~/smollm2 .models/smollm2-4l --layers 4 --vocab 8192

The GPU check runs run.sh on such a folder: the device's working tree is at most 64 MiB, and
SmolLM2's float32 safetensors are 538 MB. Token ids past the kept vocabulary are not in the
trimmed model (the tokenizer files are copied as they are, for reading, not for generating).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from variants.checkpoint.formats import read_checkpoint  # noqa: E402
from variants.spec import dtype_from_name  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def trim(state: dict, layers: int, vocab: int, dtype: torch.dtype) -> dict:
    """The first `layers` layers and `vocab` rows of the embedding and head, in `dtype`."""
    kept = {}
    for name, tensor in state.items():
        parts = name.split(".")
        if "layers" in parts and int(parts[parts.index("layers") + 1]) >= layers:
            continue
        if name.endswith(("embed_tokens.weight", "lm_head.weight")):
            tensor = tensor[:vocab]
        kept[name] = tensor.to(dtype).contiguous()
    return kept


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("source", help="a Hugging Face model folder (config.json + weights)")
    p.add_argument("output", help="the new folder (created; must not exist)")
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--dtype", default="bfloat16", help="stored dtype and torch_dtype")
    args = p.parse_args(argv)
    source, output = Path(args.source), Path(args.output)
    if output.exists():
        print(f"error: {output} exists: pass a new folder", file=sys.stderr)
        return 2
    config = json.loads((source / "config.json").read_text())
    if (
        not 0 < args.layers <= config["num_hidden_layers"]
        or not 0 < args.vocab <= config["vocab_size"]
    ):
        print("error: --layers and --vocab must be within the model's", file=sys.stderr)
        return 2
    from safetensors.torch import save_file

    dtype = dtype_from_name(args.dtype)
    state = trim(read_checkpoint(source).state, args.layers, args.vocab, dtype)
    output.mkdir(parents=True)
    save_file(state, str(output / "model.safetensors"))
    config.update(num_hidden_layers=args.layers, vocab_size=args.vocab, torch_dtype=args.dtype)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if isinstance(config.get(key), int) and config[key] >= args.vocab:
            config.pop(key)
    (output / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, output / name)
    size = (output / "model.safetensors").stat().st_size / 2**20
    print(f"wrote {output}: {args.layers} layers, vocab {args.vocab}, {args.dtype}, {size:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
