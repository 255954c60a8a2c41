"""The decoder model: weights, rotary table, attention and the layers chosen for it, and the one
forward pass. A runner (engine.py's EagerRunner, or CUDA graphs) calls `embed`, `forward` and
`logits`; the engine around it keeps the requests and the cache, and the model reads the cache
only through what a call hands it (the cache and its plan)."""

import torch

from variants.layers.block import make_layer_math
from variants.layers.rope import RopeTable


class Model:
    def __init__(self, spec, weights, device, dtype, attention, layers, wrap=None, head=None):
        """`layers(model, x, positions, cache, plan, batch)`: the decoder layers it is built
        with (torch ops, our Triton kernels or the fused few-row kernels); `wrap(fn)`, when
        given, the execution mode applied to the per-layer math (torch.compile); `head(spec,
        output_logits)`, when given, replaces the output head (falling back to the one it is
        given where it does not apply)."""
        self.spec, self.weights, self.device, self.dtype = spec, weights, device, dtype
        self.attention, self.layers = attention, layers
        self.rope = RopeTable(
            spec.head_dim, spec.max_positions, spec.rope_theta, device, dtype, spec.rope_scaling
        )
        math = make_layer_math(spec)
        self.attention_inputs, self.attention_outputs, logits = map(wrap, math) if wrap else math
        self.output_logits = logits if head is None else head(spec, logits)

    def in_vocab(self, tokens, out=None) -> torch.Tensor:
        """The ids a step runs with, clamped into the vocabulary (into `out`, a graph's static
        buffer, when given: the clamp is then also the copy). Ids on the GPU are range-checked
        after the step is queued (the engine's DeferredRangeCheck); a bad one must not reach the
        embedding as an out-of-bounds read or a device-side assert first."""
        return torch.clamp(tokens, 0, self.spec.vocab_size - 1, out=out)

    def embed(self, tokens, out=None) -> torch.Tensor:
        return self.weights.embed[self.in_vocab(tokens, out=out)]

    def forward(self, x, positions, cache, plan, batch=None) -> torch.Tensor:
        """The residual stream after the last layer. x: the embedded tokens [N, hidden] (a fresh
        tensor, the layers' to update in place); positions [N]; `plan`: where the call's keys and
        values go in `cache` and what a decode step reads; `batch`: the prefill's prompts
        (attention/padding.py), None at decode."""
        return self.layers(self, x, positions, cache, plan, batch)

    def logits(self, x) -> torch.Tensor:
        """A fresh float32 tensor: the head's output is never a reused buffer."""
        return self.output_logits(x, self.weights.norm, self.weights.head).float()
