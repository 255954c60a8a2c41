"""The fused decode layers' projection kernels, their tiles and K splits measured where they
matter: the GPU time of a whole decode step (its CUDA graph replayed back to back), per shape,
for each setting in turn, rounds interleaved; the logits of each setting against the first's.

    python experiments/step_kernels.py --shapes 8x40,8x150 --setting base=default \\
        --setting o4=o:-/4 --setting qkv2=qkv:16,256,4,3/2+o:-/2

    python experiments/step_kernels.py --shapes 8x150 --setting base=o:-@off+down:-@off \
        --setting staged=default --setting o2=o:32,128,4,3/2@on

A setting is `default` or overrides joined by `+`, each KERNEL:TILES[/SPLIT_K][@STAGE] where
KERNEL is qkv (norm + QKV + RoPE), o (the output projection), gateup (norm + gate-up +
SiLU-mul), down or head, TILES is BLOCK_N,BLOCK_K,WARPS,STAGES or `-` (the launcher's own),
SPLIT_K the K splits (default: the launcher's) and STAGE `on` or `off`: the weight staged in
registers before the PDL wait (where it fits, `staged_dot.stage_chunks`) or not (default: the
launcher's rule)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import variants.layers.fused_stack as fused_stack  # noqa: E402
from experiments.step_sweep import main  # noqa: E402

ORIGINAL = {
    "few_row_linear": fused_stack.few_row_linear,
    "norm_qkv_rope": fused_stack.norm_qkv_rope,
    "norm_swiglu": fused_stack.norm_swiglu,
}
KERNELS = ("qkv", "o", "gateup", "down", "head")


def parse(setting: str) -> dict:
    """{kernel: {"tiles": tuple | None, "split_k": int | None[, "stage": bool]}} of a
    setting."""
    if setting == "default":
        return {}
    out = {}
    for part in setting.split("+"):
        kernel, spec = part.split(":")
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}; one of {', '.join(KERNELS)}")
        spec, _, stage = spec.partition("@")
        tiles, _, split = spec.partition("/")
        out[kernel] = {
            "tiles": None if tiles == "-" else tuple(int(v) for v in tiles.split(",")),
            "split_k": int(split) if split else None,
        }
        if stage:
            if stage not in ("on", "off"):
                raise ValueError(f"stage {stage!r} of {part!r}: on or off")
            out[kernel]["stage"] = stage == "on"
    return out


def _linear_kind(weight, norm) -> str:
    if norm is not None:
        return "head"
    return "down" if weight.shape[1] > weight.shape[0] else "o"


def use(setting: str) -> None:
    """Route the fused layers' launches through `setting`'s tiles and splits."""
    forced = parse(setting)

    def linear(x, weight, norm=None, *args, **kwargs):
        kwargs.update(forced.get(_linear_kind(weight, norm), {}))
        return ORIGINAL["few_row_linear"](x, weight, norm, *args, **kwargs)

    def qkv(*args, **kwargs):
        return ORIGINAL["norm_qkv_rope"](*args, **kwargs, **forced.get("qkv", {}))

    def gateup(*args, **kwargs):
        return ORIGINAL["norm_swiglu"](*args, **kwargs, **forced.get("gateup", {}))

    fused_stack.few_row_linear = linear if forced else ORIGINAL["few_row_linear"]
    fused_stack.norm_qkv_rope = qkv if forced else ORIGINAL["norm_qkv_rope"]
    fused_stack.norm_swiglu = gateup if forced else ORIGINAL["norm_swiglu"]


if __name__ == "__main__":
    sys.exit(main(__doc__, use, "NAME=default|KERNEL:...", check=parse))
