"""Hugging Face LLaMA configs in the course's keys: `torch_dtype` from `dtype` as transformers
>= 4.56 writes it, `rope_theta` from `rope_parameters` (transformers 5), `head_dim` and
`num_key_value_heads` by LLaMA's defaults; what the engine cannot compute (biases, scaled RoPE,
another activation) is refused by name."""


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
            raise ValueError(
                f"model_config: {source} type {kind!r} is not supported (only plain RoPE)"
            )
    given = (config.get("rope_theta"), params.get("rope_theta"))
    thetas = {float(t) for t in given if t is not None}
    if len(thetas) > 1:
        raise ValueError(f"model_config: rope_theta and rope_parameters disagree: {sorted(thetas)}")
    return thetas.pop() if thetas else 10000.0


def check_supported_features(config: dict) -> None:
    """Refuse configs whose model differs from the one the engine computes."""
    act = config.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"model_config: hidden_act {act!r} is not supported (only silu)")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise ValueError(f"model_config: {key} is true; layers with biases are not supported")


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
