"""The decoder stack in plain PyTorch ops: per layer, the (wrapped) math before attention, the
cache write, attention, and the (wrapped) math after it. Runs anywhere; on a GPU each layer is
dozens of small kernels, which torch.compile or CUDA graphs then fuse or replay."""


def run_torch_stack(model, x, positions, cache, plan, batch):
    """Model.forward's layers: x, the embedded tokens or rows [tokens or rows, hidden]. Returns
    the residual stream after the last layer."""
    cos, sin = model.rope.at(positions)
    for n, w in enumerate(model.weights.layers):
        q, k, v = model.attention_inputs(
            x, w.input_norm, w.qkv, cos, sin, w.qkv_bias, w.q_norm, w.k_norm
        )
        cache.write(n, plan, k, v)
        if batch is not None:
            o = model.attention.prefill(q, k, v, batch)
        else:
            o = model.attention.decode_from_cache(q, cache, n, plan)
        x = model.attention_outputs(x, o, w.o, w.post_norm, w.gate_up, w.down)
    return x
