"""The decoder stack in plain PyTorch ops: per layer, the (wrapped) math before attention, the
cache write, attention, and the (wrapped) math after it. Runs anywhere; on a GPU each layer is
dozens of small kernels, which torch.compile or CUDA graphs then fuse or replay."""


def run_torch_stack(engine, x, positions, plan, batch):
    """x: the embedded tokens or rows, [tokens or rows, hidden]. Returns the residual stream
    after the last layer."""
    cos, sin = engine.rope.at(positions)
    for n, w in enumerate(engine.weights.layers):
        q, k, v = engine.attention_inputs(x, w.input_norm, w.qkv, cos, sin)
        engine.cache.write(n, plan, k, v)
        if batch is not None:
            o = engine.attention.prefill(q, k, v, batch)
        else:
            o = engine.attention.decode_from_cache(q, engine.cache, n, plan)
        x = engine.attention_outputs(x, o, w.o, w.post_norm, w.gate_up, w.down)
    return x
