"""The tokenizer of a GGUF file as Hugging Face files: `tokenizer.json`, a byte-level BPE built
with `tokenizers` from the vocabulary and merges in the metadata, and `tokenizer_config.json`
(special tokens, whether BOS/EOS are added, the chat template).

Only byte-level BPE (`tokenizer.ggml.model == "gpt2"`) whose text splitting (`tokenizer.ggml.pre`)
is one of PRE_TOKENIZERS: another split would give other tokens without any error."""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types: special tokens and plain added ones
# llama.cpp's pre-tokenizer name -> whether every digit is split off before GPT-2's word regex.
PRE_TOKENIZERS = {"gpt-2": False, "smollm": True, "starcoder": True, "refact": True}


def pre_tokenizer(meta: dict):
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(
            f"tokenizer.ggml.pre {pre!r} is not supported (supported: {', '.join(PRE_TOKENIZERS)})"
        )
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", False))
    words = pre_tokenizers.ByteLevel(add_prefix_space=prefix, use_regex=True)  # GPT-2's regex
    if not PRE_TOKENIZERS[pre]:
        return words
    digits = pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated")
    return pre_tokenizers.Sequence([digits, words])


def special_token(meta: dict, name: str) -> str | None:
    token_id = meta.get(f"tokenizer.ggml.{name}_token_id")
    return None if token_id is None else meta["tokenizer.ggml.tokens"][token_id]


def post_processor(meta: dict):
    """BOS / EOS around every text when the metadata asks for them, else None."""
    added = {}
    for name in ("bos", "eos"):
        token_id = meta.get(f"tokenizer.ggml.{name}_token_id")
        if meta.get(f"tokenizer.ggml.add_{name}_token") and token_id is not None:
            added[name] = (meta["tokenizer.ggml.tokens"][token_id], int(token_id))
    if not added:
        return None
    first = [added["bos"][0]] if "bos" in added else []
    last = [added["eos"][0]] if "eos" in added else []
    second = [f"{t}:1" for t in first] + ["$B:1"] + [f"{t}:1" for t in last]
    return processors.TemplateProcessing(
        single=first + ["$A"] + last,
        pair=first + ["$A"] + last + second,
        special_tokens=list(added.values()),
    )


def byte_level_tokenizer(meta: dict) -> Tokenizer:
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"tokenizer.ggml.model is {kind!r}; only byte-level BPE ('gpt2') is supported"
        )
    tokens = meta["tokenizer.ggml.tokens"]
    vocab: dict = {}
    for token_id, token in enumerate(tokens):
        vocab.setdefault(token, token_id)  # a duplicate keeps its first id
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    bad = next((m for m in merges if len(m) != 2), None)
    if bad is not None:
        raise ValueError(f"tokenizer.ggml.merges holds {' '.join(bad)!r}, not two tokens")
    tokenizer = Tokenizer(models.BPE(vocab, merges))
    tokenizer.pre_tokenizer = pre_tokenizer(meta)
    tokenizer.decoder = decoders.ByteLevel()
    processor = post_processor(meta)
    if processor is not None:
        tokenizer.post_processor = processor
    types = meta.get("tokenizer.ggml.token_type") or []
    added = [(tokens[i], kind) for i, kind in enumerate(types) if kind in (CONTROL, USER_DEFINED)]
    # Added tokens are matched whole in the raw text before any splitting.
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, kind in added if kind == CONTROL]
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, kind in added if kind != CONTROL]
    )
    return tokenizer


def tokenizer_config(meta: dict, max_length: int) -> dict:
    """`tokenizer_config.json`: special tokens by text, BOS/EOS flags and the chat template."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",  # tokenizer.json as written, nothing added
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        token = special_token(meta, key)
        if token is not None:
            config[f"{name}_token"] = token
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    return config


def generation_config(model_config: dict) -> dict:
    """`generation_config.json`: the ids `generate` starts and stops with (greedy by default)."""
    keys = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {k: model_config[k] for k in keys if k in model_config}
