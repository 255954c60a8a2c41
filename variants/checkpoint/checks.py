"""The names and shapes a checkpoint must hold for a config, checked key by key: the first
missing, misshapen or unexpected tensor is named."""


def expected_shapes(spec) -> dict:
    h, i, v = spec.hidden_size, spec.intermediate_size, spec.vocab_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    layer = {
        "input_layernorm.weight": (h,), "self_attn.q_proj.weight": (q, h),
        "self_attn.k_proj.weight": (kv, h), "self_attn.v_proj.weight": (kv, h),
        "self_attn.o_proj.weight": (h, q), "post_attention_layernorm.weight": (h,),
        "mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h),
        "mlp.down_proj.weight": (h, i),
    }  # fmt: skip
    if spec.qkv_bias:
        layer |= {f"self_attn.{x}_proj.bias": (n,) for x, n in (("q", q), ("k", kv), ("v", kv))}
    if spec.qk_norm:
        layer |= {f"self_attn.{x}_norm.weight": (spec.head_dim,) for x in "qk"}
    shapes = {"embed_tokens.weight": (v, h), "norm.weight": (h,), "lm_head.weight": (v, h)}
    for n in range(spec.num_layers):
        shapes.update({f"layers.{n}.{name}": shape for name, shape in layer.items()})
    return shapes


def check_state_dict(spec, state: dict) -> None:
    shapes = expected_shapes(spec)
    for key, shape in shapes.items():
        if key not in state:
            raise KeyError(f"weight {key!r} is missing (expected shape {list(shape)})")
        got = tuple(state[key].shape)
        if got != shape:
            raise ValueError(f"weight {key!r} has shape {list(got)}, expected {list(shape)}")
        if not (dtype := state[key].dtype).is_floating_point:
            raise ValueError(f"weight {key!r} has dtype {dtype}, expected floating point")
    for key in sorted(state.keys() - shapes.keys()):
        if key.endswith(".bias"):
            raise ValueError(f"weight {key!r} is a bias, which this model's layers do not have")
        layer = key.split(".")[1] if key.startswith("layers.") else ""
        if layer.isdigit() and int(layer) >= spec.num_layers:
            raise ValueError(
                f"weight {key!r} belongs to layer {layer}, but num_hidden_layers is "
                f"{spec.num_layers}: config and checkpoint disagree"
            )
