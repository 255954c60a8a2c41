"""The physical floor of a trace: what the device's bandwidth and FLOP/s allow, call by call.

Each engine call costs at least max(FLOPs / peak FLOP/s, bytes / bandwidth). Bytes: every
layer's weights, the final norm and lm_head read once per call, the embedding rows used, and the
KV cache (a decode reads its request's live context, K and V, every layer; new K/V are written),
all in the compute dtype. Activations and the logits are left out, so this is a lower bound.
FLOPs: 2 * matmul params * tokens, causal attention (QK^T and PV), lm_head only for the last
position of each prompt and each decode row. Floor efficiency = floor seconds / measured seconds.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from evaluator.reference_model import compute_dtype_for
from evaluator.traces import Decode, Prefill, Trace, replay


@dataclass(frozen=True)
class Ceilings:
    bandwidth_gbs: float  # bytes moved (read + write) per second, in 1e9
    tflops: float  # matmul FLOP/s in the compute dtype, in 1e12
    source: str = "given"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CostModel:
    """Per-token and per-call costs of one model, derived from its config."""

    matmul_params: int  # q, k, v, o, gate, up, down over all layers (FLOPs = 2 * this / token)
    weight_bytes: int  # read once per call: layers, final norm, lm_head
    embed_row_bytes: int
    kv_bytes_per_token: int  # K and V, all layers
    attn_flops_per_pair: int  # QK^T + PV for one (query, key) pair, all heads and layers
    lm_head_flops: int  # one row of logits

    @classmethod
    def from_config(cls, config: dict, dtype_bytes: int) -> CostModel:
        h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
        layers, nh = config["num_hidden_layers"], config["num_attention_heads"]
        nkv = config["num_key_value_heads"]
        hd = config.get("head_dim") or h // nh
        per_layer = 2 * h * nh * hd + 2 * h * nkv * hd + 3 * h * inter
        return cls(
            matmul_params=layers * per_layer,
            weight_bytes=dtype_bytes * (layers * (per_layer + 2 * h) + h + vocab * h),
            embed_row_bytes=dtype_bytes * h,
            kv_bytes_per_token=dtype_bytes * 2 * layers * nkv * hd,
            attn_flops_per_pair=4 * layers * nh * hd,
            lm_head_flops=2 * h * vocab,
        )

    def prefill(self, lengths: tuple[int, ...]) -> tuple[float, float]:
        """(FLOPs, bytes) of one prefill call of prompts with these lengths."""
        tokens = sum(lengths)
        pairs = sum(n * (n + 1) // 2 for n in lengths)  # causal, diagonal included
        flops = (
            2 * self.matmul_params * tokens
            + self.attn_flops_per_pair * pairs
            + self.lm_head_flops * len(lengths)
        )
        moved = self.weight_bytes + (self.embed_row_bytes + self.kv_bytes_per_token) * tokens
        return flops, moved

    def decode(self, contexts: tuple[int, ...]) -> tuple[float, float]:
        """(FLOPs, bytes) of one decode call; `contexts` are lengths after the new token."""
        rows = len(contexts)
        flops = (
            2 * self.matmul_params * rows
            + self.attn_flops_per_pair * sum(contexts)
            + self.lm_head_flops * rows
        )
        # Read the c - 1 cached tokens' K/V and write the new one: c tokens of KV traffic.
        moved = (
            self.weight_bytes
            + self.embed_row_bytes * rows
            + self.kv_bytes_per_token * sum(contexts)
        )
        return flops, moved


def dtype_bytes_for(config: dict, device: str | torch.device = "cuda") -> int:
    """Bytes per element of the reference's compute dtype there: 2 on CUDA, 4 on CPU."""
    return compute_dtype_for(config, device).itemsize


def call_costs(trace: Trace, config: dict, dtype_bytes: int = 2) -> list[tuple[float, float]]:
    """(FLOPs, bytes) of every prefill and decode call of `trace`, in order."""
    model = CostModel.from_config(config, dtype_bytes)
    costs = []
    for op, lengths in replay(trace):
        if isinstance(op, Prefill):
            costs.append(model.prefill(lengths))
        elif isinstance(op, Decode):
            costs.append(model.decode(lengths))
    return costs


def trace_floor_seconds(
    trace: Trace, config: dict, ceilings: Ceilings, dtype_bytes: int = 2
) -> float:
    """Sum over calls of max(FLOPs / peak FLOP/s, bytes / bandwidth)."""
    flops_per_s, bytes_per_s = ceilings.tflops * 1e12, ceilings.bandwidth_gbs * 1e9
    return sum(
        max(f / flops_per_s, b / bytes_per_s) for f, b in call_costs(trace, config, dtype_bytes)
    )


def floor_efficiency(floor_seconds: float, measured_seconds: float) -> float | None:
    """floor / measured, at most 1 by definition; None when over 1: the ceilings were measured
    below what the engine reached (a busy or throttled machine, a CPU's rough figures), so the
    floor is no floor."""
    efficiency = floor_seconds / measured_seconds
    return efficiency if efficiency <= 1.0 else None


# --- measuring the ceilings -------------------------------------------------------------------


def _median_seconds(fn, device: torch.device, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            start_s = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start_s)
    return statistics.median(times)


def measure_ceilings(
    device: str | torch.device,
    dtype: torch.dtype | None = None,
    bandwidth_gbs: float | None = None,
    tflops: float | None = None,
) -> Ceilings:
    """Measure what is not given: a large device-to-device copy (read + write bytes) and a large
    matmul (8192^3 in fp16 on CUDA; small float32 sizes on CPU, a rough figure), medians after
    warm-up.
    """
    device = torch.device(device)
    on_cuda = device.type == "cuda"
    dtype = dtype or (torch.float16 if on_cuda else torch.float32)
    where = torch.cuda.get_device_name(device) if on_cuda else "cpu"
    measured = [name for name, v in (("bandwidth", bandwidth_gbs), ("tflops", tflops)) if v is None]
    source = f"{' and '.join(measured)} measured on {where} ({dtype})" if measured else "given"
    if bandwidth_gbs is None:
        numel = (2**28 if on_cuda else 2**23) // torch.tensor([], dtype=dtype).element_size()
        src = torch.empty(numel, dtype=dtype, device=device).fill_(1)
        dst = torch.empty_like(src)
        secs = _median_seconds(lambda: dst.copy_(src), device, warmup=3, reps=10 if on_cuda else 5)
        bandwidth_gbs = 2 * src.numel() * src.element_size() / secs / 1e9
        del src, dst
    if tflops is None:
        n = 8192 if on_cuda else 512
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        secs = _median_seconds(lambda: a @ b, device, warmup=3, reps=10 if on_cuda else 5)
        tflops = 2 * n**3 / secs / 1e12
        del a, b
    if on_cuda:
        torch.cuda.empty_cache()
    return Ceilings(float(bandwidth_gbs), float(tflops), source)
