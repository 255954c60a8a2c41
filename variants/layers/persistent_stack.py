"""The decode step with a persistent launch a layer: the fused layers' five kernels run as the
phases of one kernel, with grid barriers between them (variants/kernels/decode_layer.py). Up to
16 rows; more rows and prefill run the Triton stack, and the head is the fused one, as for the
fused layers. Needs CUDA, Triton >= 3.0, fp16/bf16, a slab or paged pool, the Triton attention
and the fused QKV and gate-up weights."""

from variants.kernels.decode_layer import MAX_ROWS, DecodeLayers
from variants.kernels.device import device_sm_count
from variants.layers.triton_stack import run_triton_stack


def run_persistent_stack(engine, x, positions, plan, batch):
    if batch is not None or x.shape[0] > MAX_ROWS:
        return run_triton_stack(engine, x, positions, plan, batch)
    cache = engine.cache
    # x is the step's own fresh tensor (Engine.embed): the layers update it in place
    cos, sin = engine.rope.at(positions)
    layers = DecodeLayers(
        engine.spec, x.shape[0], plan.max_len, x.device, x.dtype, device_sm_count(x.device)
    )
    stack = engine.weights.layers
    for n, w in enumerate(stack):
        after = stack[n + 1].qkv[0] if n + 1 < len(stack) else engine.weights.head
        layers.run(
            x, w, cos, sin, plan.write_index, cache.k[n], cache.v[n], plan.table, plan.kv_lens,
            cache.kernel_block_size, next_weight=after,
        )  # fmt: skip
    return x
