"""Hugging Face LLaMA configs in the course's keys: `torch_dtype` from `dtype` as transformers
>= 4.56 writes it, `rope_theta` from `rope_parameters` (transformers 5), `head_dim` and
`num_key_value_heads` by LLaMA's defaults. The architectures the engine computes are named in one
table; any other, and any feature of a named one that the engine does not compute, is refused in
one line that names it."""

from dataclasses import dataclass


class NotComputed(ValueError):
    """A model, or a feature of one, that the engine does not compute; the message names it."""


@dataclass(frozen=True)
class Architecture:
    """A model the engine computes, as config.json names it (`architectures`, `model_type`)."""

    name: str
    model_type: str
    rope_layout: str  # how its checkpoints order each head's q/k rows (hf_llama.py)
    what: str


# The course's own config may name its model otherwise: a config in the course's keys alone is
# the course contract's LLaMA whatever its name, and its weights are the course's interleaved
# model.pt (hf_llama.py).
ARCHITECTURES = (
    Architecture("LlamaForCausalLM", "llama", "rotate_half", "Hugging Face's LLaMA"),
    Architecture("TinyLlamaForCausalLM", "tiny_llama", "interleaved", "the course's LLaMA"),
)
COURSE_ARCHITECTURE = ARCHITECTURES[1]
# config.json's own keys, beside the course's, that name no feature of the model
COURSE_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta",
    "torch_dtype", "model_type", "architectures",
)  # fmt: skip


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


def rope_theta_of(config: dict) -> float:
    """`rope_theta`, or `rope_parameters["rope_theta"]` (transformers 5); only unscaled RoPE."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    for source, table in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not isinstance(table, dict):
            raise ValueError(f"model_config: {source} must be an object, got {table!r}")
        kind = table.get("rope_type", table.get("type", "default"))
        if kind not in (None, "default"):
            raise NotComputed(
                f"model_config: {source} type {kind!r} is not supported (only plain RoPE)"
            )
    given = (config.get("rope_theta"), params.get("rope_theta"))
    thetas = {float(t) for t in given if t is not None}
    if len(thetas) > 1:
        raise ValueError(f"model_config: rope_theta and rope_parameters disagree: {sorted(thetas)}")
    return thetas.pop() if thetas else 10000.0


def check_supported_features(config: dict) -> None:
    """Refuse configs whose model differs from the one the engine computes: an architecture
    outside the table, or a feature its plain form lacks."""
    arch = architecture_of(config)
    act = config.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise NotComputed(f"model_config: hidden_act {act!r} is not supported (only silu)")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise NotComputed(f"model_config: {key} is true; layers with biases are not supported")
    for key in ("qk_norm", "use_qk_norm", "qk_layernorm"):
        if config.get(key):
            raise NotComputed(f"model_config: {key} is true; q/k norms are not computed")
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        raise NotComputed(
            f"model_config: partial_rotary_factor {config['partial_rotary_factor']} is not "
            "supported (RoPE over the whole head only)"
        )
    window, served = config.get("sliding_window"), config.get("max_position_embeddings")
    if config.get("use_sliding_window", True) and window is not None:
        if not isinstance(served, int) or window < served:
            raise NotComputed(
                f"model_config: sliding_window {window} is shorter than the {served} positions "
                f"served; {arch.name} is computed with full attention, without a window"
            )


def course_keys(config: dict) -> dict:
    """`config` with the course's keys that it gives under other names, or by default, filled
    in (a key it lacks that has no default stays missing, for ModelSpec to name)."""
    check_supported_features(config)
    keys = {**config, "torch_dtype": config_dtype_name(config), "rope_theta": rope_theta_of(config)}
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


def reads_as_course(config: dict) -> bool:
    """Whether the course's own config reader (course_config.py) reads `config` as this one
    does: it holds the course's keys alone and none needs filling in. An engine written for such
    a target may carry that reader alone (search/setup.py: `Target.weights_format`)."""
    # imported here: an engine carries one of the two readers, never both
    from variants.checkpoint.course_config import course_keys as course_only

    try:
        return course_only(config) == course_keys(config)
    except ValueError:
        return False
