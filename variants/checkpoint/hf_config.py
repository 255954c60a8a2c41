"""Hugging Face configs in the course's keys: `torch_dtype` from `dtype` as transformers >= 4.56
writes it, `rope_theta` from `rope_parameters` (transformers 5), `head_dim` and
`num_key_value_heads` by LLaMA's defaults, and the parts of the architecture beyond LLaMA's. The
architectures the engine computes are named in one table; any other, and any feature of a named
one that the engine does not compute, is refused in one line that names it."""

from dataclasses import dataclass


class NotComputed(ValueError):
    """A model, or a feature of one, that the engine does not compute; the message names it."""


@dataclass(frozen=True)
class Architecture:
    """A model the engine computes, as config.json names it (`architectures`, `model_type`), and
    what it adds to LLaMA's layer (ModelSpec's fields of the same names)."""

    name: str
    model_type: str
    rope_layout: str  # how its checkpoints order each head's q/k rows (hf_llama.py)
    what: str
    qkv_bias: bool = False  # the q, k and v projections carry biases
    qk_norm: bool = False  # an RMSNorm over each head of q and k before RoPE
    # where its config gives a sliding window: "sliding_window" (every layer attends to the
    # last so many positions; null: full attention), "use_sliding_window" (Qwen's switch, for
    # windows on some layers only, which are not computed), or None (it has none)
    window: str | None = None


# One entry an architecture (and its held-out checkpoint in the tests). The course's own
# config may name its model otherwise: a config in the course's keys alone is the course
# contract's LLaMA whatever its name, and its weights are the course's interleaved model.pt.
ARCHITECTURES = (
    Architecture("LlamaForCausalLM", "llama", "rotate_half", "LLaMA 2 and 3.x, SmolLM2"),
    Architecture("TinyLlamaForCausalLM", "tiny_llama", "interleaved", "the course's LLaMA"),
    Architecture("MistralForCausalLM", "mistral", "rotate_half", "Mistral",
                 window="sliding_window"),
    Architecture("Qwen2ForCausalLM", "qwen2", "rotate_half", "Qwen2 and Qwen2.5", qkv_bias=True,
                 window="use_sliding_window"),
    Architecture("Qwen3ForCausalLM", "qwen3", "rotate_half", "Qwen3", qk_norm=True,
                 window="use_sliding_window"),
)  # fmt: skip
COURSE_ARCHITECTURE = ARCHITECTURES[1]
# config.json's own keys, beside the course's, that name no feature of the model
COURSE_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta",
    "torch_dtype", "model_type", "architectures",
)  # fmt: skip
# Llama 3.x's `llama3` RoPE scaling: its keys, in ModelSpec.rope_scaling's order
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def supported_names() -> str:
    return ", ".join(f"{a.name} ({a.model_type}: {a.what})" for a in ARCHITECTURES)


def architecture_of(config: dict) -> Architecture:
    """The table's entry the config names by `architectures` and `model_type`. A config that
    names none, or names another but holds the course's keys alone, is the course's model: the
    course contract defines it whatever its name."""
    names = config.get("architectures") or []
    names = [names] if isinstance(names, str) else list(names)
    given = [(f"architectures {n!r}", lambda a, n=n: a.name == n) for n in names]
    if (model_type := config.get("model_type")) is not None:
        given.append((f"model_type {model_type!r}", lambda a: a.model_type == model_type))
    found, unknown = set(), []
    for said, matches in given:
        known = {a for a in ARCHITECTURES if matches(a)}
        found |= known
        unknown += [] if known else [said]
    if not given or unknown and set(config) <= set(COURSE_KEYS):
        return COURSE_ARCHITECTURE
    if unknown:
        raise NotComputed(
            f"model_config: {unknown[0]} is not an architecture this engine computes; "
            f"supported: {supported_names()}"
        )
    if len(found) > 1:
        raise ValueError(
            "model_config: " + " and ".join(s for s, _ in given) + " name different models"
        )
    return found.pop()


def config_dtype_name(config: dict) -> str:
    """`torch_dtype`, or `dtype` as transformers >= 4.56 writes it; float16 when neither."""
    for key in ("torch_dtype", "dtype"):
        if config.get(key) is not None:
            return str(config[key])
    return "float16"


def rope_tables(config: dict) -> list:
    """(source, table) of the config's RoPE settings: `rope_parameters` (transformers 5) and
    `rope_scaling` (earlier versions), each an object."""
    tables = []
    for source in ("rope_parameters", "rope_scaling"):
        table = config.get(source) or {}
        if not isinstance(table, dict):
            raise ValueError(f"model_config: {source} must be an object, got {table!r}")
        tables.append((source, table))
    return tables


def rope_theta_of(config: dict) -> float:
    """`rope_theta`, or `rope_parameters["rope_theta"]` (transformers 5)."""
    params = dict(rope_tables(config))["rope_parameters"]
    given = (config.get("rope_theta"), params.get("rope_theta"))
    thetas = {float(t) for t in given if t is not None}
    if len(thetas) > 1:
        raise ValueError(f"model_config: rope_theta and rope_parameters disagree: {sorted(thetas)}")
    return thetas.pop() if thetas else 10000.0


def rope_scaling_of(config: dict) -> tuple | None:
    """Llama 3.x's scaling as ModelSpec.rope_scaling holds it (LLAMA3_KEYS' values), None for
    plain RoPE; any other kind is refused by name."""
    found = None
    for source, table in rope_tables(config):
        kind = table.get("rope_type", table.get("type", "default"))
        if kind in (None, "default"):
            continue
        if kind != "llama3":
            raise NotComputed(
                f"model_config: {source} type {kind!r} is not computed (plain RoPE and llama3 "
                "scaling only)"
            )
        if missing := [key for key in LLAMA3_KEYS if table.get(key) is None]:
            raise ValueError(f"model_config: {source} of type 'llama3' lacks {', '.join(missing)}")
        scaling = tuple(float(table[key]) for key in LLAMA3_KEYS)
        if found is not None and found != scaling:
            raise ValueError("model_config: rope_parameters and rope_scaling disagree")
        if not scaling[1] < scaling[2]:
            raise ValueError(
                "model_config: llama3 scaling needs low_freq_factor < high_freq_factor"
            )
        found = scaling
    return found


def sliding_window_of(config: dict, arch: Architecture) -> int | None:
    """The window every layer attends over, None for full attention. A window at least as long
    as the positions served changes nothing and is dropped."""
    if arch.window == "use_sliding_window":
        if config.get("use_sliding_window") or "sliding_attention" in (
            config.get("layer_types") or []
        ):
            raise NotComputed(
                f"model_config: use_sliding_window is true; {arch.name}'s windows on some layers "
                "only (max_window_layers) are not computed"
            )
        return None
    window = config.get("sliding_window") if arch.window == "sliding_window" else None
    if window is None:
        return None
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        raise ValueError(f"model_config: sliding_window must be a positive integer, got {window!r}")
    served = config.get("max_position_embeddings")
    return None if isinstance(served, int) and window >= served else window


def check_supported_features(config: dict, arch: Architecture) -> None:
    """Refuse a feature the architecture's form in the table lacks."""
    act = config.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise NotComputed(f"model_config: hidden_act {act!r} is not supported (only silu)")
    for key, what in (("attention_bias", "the attention's"), ("mlp_bias", "the MLP's")):
        if config.get(key):
            raise NotComputed(
                f"model_config: {key} is true; {what} biases are not computed for {arch.name}"
            )
    for key in ("qk_norm", "use_qk_norm", "qk_layernorm"):
        if config.get(key) and not arch.qk_norm:
            raise NotComputed(f"model_config: {key} is true; {arch.name} has no q/k norms here")
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        raise NotComputed(
            f"model_config: partial_rotary_factor {config['partial_rotary_factor']} is not "
            "supported (RoPE over the whole head only)"
        )


def course_keys(config: dict) -> dict:
    """`config` with the course's keys that it gives under other names, or by default, filled
    in (a key it lacks that has no default stays missing, for ModelSpec to name)."""
    arch = architecture_of(config)
    check_supported_features(config, arch)
    keys = {**config, "torch_dtype": config_dtype_name(config), "rope_theta": rope_theta_of(config)}
    parts = {
        "rope_scaling": rope_scaling_of(config), "sliding_window": sliding_window_of(config, arch),
        "qkv_bias": arch.qkv_bias, "qk_norm": arch.qk_norm,
    }  # fmt: skip
    for key, value in parts.items():  # ModelSpec's defaults are LLaMA's: only the others given
        if value:
            keys[key] = value
        else:
            keys.pop(key, None)
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    if heads is not None:
        keys.setdefault("num_key_value_heads", heads)
    if keys.get("head_dim") is None and None not in (heads, hidden):
        heads, hidden = int(heads), int(hidden)
        if heads <= 0 or hidden % heads:
            raise ValueError(
                f"head_dim is absent and hidden_size {hidden} is not divisible by "
                f"num_attention_heads {heads}"
            )
        keys["head_dim"] = hidden // heads
    return keys
