"""The names and shapes a checkpoint must hold for a config, checked key by key: the first
missing, misshapen or unexpected tensor is named."""


def expected_shapes(spec) -> dict:
    h, i, v = spec.hidden_size, spec.intermediate_size, spec.vocab_size
    q_rows, kv_rows = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    shapes = {"embed_tokens.weight": (v, h), "norm.weight": (h,), "lm_head.weight": (v, h)}
    for n in range(spec.num_layers):
        p = f"layers.{n}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q_rows, h),
                p + "self_attn.k_proj.weight": (kv_rows, h),
                p + "self_attn.v_proj.weight": (kv_rows, h),
                p + "self_attn.o_proj.weight": (h, q_rows),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
            }
        )
    return shapes


def check_state_dict(spec, state: dict) -> None:
    shapes = expected_shapes(spec)
    for key, shape in shapes.items():
        if key not in state:
            raise KeyError(f"weight {key!r} is missing (expected shape {list(shape)})")
        got = tuple(state[key].shape)
        if got != shape:
            raise ValueError(f"weight {key!r} has shape {list(got)}, expected {list(shape)}")
        if not state[key].dtype.is_floating_point:
            raise ValueError(
                f"weight {key!r} has dtype {state[key].dtype}, expected floating point"
            )
    for key in state:
        if key in shapes:
            continue
        if key.endswith(".bias"):
            raise ValueError(f"weight {key!r} is a bias; layers with biases are not supported")
        parts = key.split(".")
        if parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit():
            if int(parts[1]) >= spec.num_layers:
                raise ValueError(
                    f"weight {key!r} belongs to layer {parts[1]}, but num_hidden_layers is "
                    f"{spec.num_layers}: config and checkpoint disagree"
                )
