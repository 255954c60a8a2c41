"""Compile our decode-step Triton kernels, the prefill attention and the Triton stack's RoPE +
cache write for a GPU this machine does not have, and report what ptxas says of each: registers
a thread, spill bytes, shared memory. Needs no GPU, only a Triton with its NVIDIA backend (ptxas
ships in the wheel), and TRITON_INTERPRET unset.

The users' RTX 3090 (sm_86) with Triton 3.0 is the oldest stack the kernels claim. Run this
under that Triton (`pip install triton==3.0.0` in a venv) to check that the kernels still
compile there and do not spill, with the tiles the launchers pick at the public model's decode
shapes (8 rows, head_dim 192, 4 kv heads) on a GPU that is not Hopper.

    python scripts/compile_check.py [--arch 86] [--threads 8] [--json PATH]

`--threads`: the kernels built side by side in threads, as the kernel searches build a move's
launches (tuning/decode_attention.py, `build_all`); each row carries its PTX's hash, so a
threaded build can be compared with a serial one (each with its own TRITON_CACHE_DIR).
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from variants.kernels.decode_attention import _decode_split_kernel  # noqa: E402
from variants.kernels.decode_attention_rules import (  # noqa: E402
    choose_num_splits,
    default_max_registers,
    default_parts,
    default_prefetch_tiles,
    default_tiles,
    long_split_programs,
)
from variants.kernels.few_row_linear import _few_row_linear_kernel  # noqa: E402
from variants.kernels.fused_rope import _rope_cache_write_kernel, rope_launch  # noqa: E402
from variants.kernels.norm_qkv_rope import _norm_qkv_rope_kernel  # noqa: E402
from variants.kernels.norm_swiglu import _norm_swiglu_kernel, swiglu_tiles  # noqa: E402
from variants.kernels.prefill_attention import (  # noqa: E402
    _varlen_prefill_kernel,
    head_parts,
    prefill_stages,
    prefill_tiles,
)
from variants.kernels.prompt_gather import EMBED_COLS, ROWS, _gather_embed_kernel  # noqa: E402
from variants.kernels.row_dot import few_row_tiles, norm_chunks  # noqa: E402
from variants.kernels.split_k import (  # noqa: E402
    LONG_K_TILES,
    default_split_k,
    host_cdiv,
    split_range,
)
from variants.kernels.staged_dot import default_stage, short_staged_tiles, stage_chunks  # noqa: E402

F16, F32, I32, I64 = "*fp16", "*fp32", "*i32", "*i64"


# Integer arguments (by name) that are multiples of 16 at the public model's shapes: the
# projections' widths and reduction lengths (768, 2304, 3072, 4096) and their splits' lengths
# (384-768). A launch specializes on them as on pointers: with them unmarked the projections'
# masks hide the 16-byte alignment, and their weight loads build as 2-byte loads outside the
# pipeline (168 registers for the output projection at sm_90 under Triton 3.9, against 48).
MULTIPLES_OF_16 = ("N", "K", "INTER", "split_len")


def aligned(fn, types: dict) -> list:
    """The arguments a launch specializes as divisible by 16 at the public model's shapes, as
    Triton's launcher does from the values it is given: every pointer (torch's allocations,
    and the views the launchers pass start at multiples of 16 bytes), every `stride_*`
    (multiples of 192 or 768 elements) but the block table's row stride (1 on a slab), and the
    integers of MULTIPLES_OF_16. Other integers (the row count, block sizes, lengths) are left
    unspecialized, so a build here may still differ from a launch's."""

    def specialized(n: str) -> bool:
        pointer_or_stride = types.get(n, "").startswith("*") or (
            n.startswith("stride_") and n != "stride_tb"
        )
        return pointer_or_stride or (n in MULTIPLES_OF_16 and types.get(n) == "i32")

    return [n for n in fn.arg_names if specialized(n)]


def _divisibility(indices: set):
    """Triton's compile attributes for arguments divisible by 16: a dict by argument path from
    Triton 3.3, an AttrsDescriptor before (3.0, 3.1); None where neither form is taken."""
    from triton.compiler import compiler

    if not hasattr(compiler, "AttrsDescriptor"):
        return {(i,): [["tt.divisibility", 16]] for i in sorted(indices)}
    try:
        return compiler.AttrsDescriptor(divisible_by_16=indices)
    except TypeError:  # 3.2's descriptor takes other arguments: unspecialized there
        return None


def source(fn, types: dict, consts: dict) -> ASTSource:
    """The kernel as a launch at the public model's shapes builds it (`aligned`). Triton
    3.0/3.1 key the signature and constants by argument index; later ones by name."""
    index = {n: i for i, n in enumerate(fn.arg_names)}
    attrs = _divisibility({index[n] for n in aligned(fn, types)})
    try:
        return ASTSource(fn, {n: types.get(n, "constexpr") for n in fn.arg_names}, consts, attrs)
    except (TypeError, AssertionError):
        sig = {index[n]: types.get(n, "constexpr") for n in fn.arg_names}
        return ASTSource(fn, sig, {index[n]: v for n, v in consts.items()}, attrs)


def ptxas_report(ptx: str) -> dict:
    """ptxas -v on the kernel's PTX. A Triton may ship more than one ptxas (3.9: one for
    Blackwell, which its newer PTX versions need): the first that accepts the PTX reports."""
    tools = sorted((Path(triton.__file__).parent / "backends" / "nvidia" / "bin").glob("ptxas*"))
    gpu = re.search(r"^\.target\s+(\w+)", ptx, re.MULTILINE).group(1)  # sm_86, sm_90a, ...
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        Path(path).write_text(ptx)
        for tool in tools:
            out = subprocess.run([str(tool), "-v", f"--gpu-name={gpu}", path, "-o", os.devnull],
                                 capture_output=True, text=True)  # fmt: skip
            if out.returncode == 0:
                break
        else:
            raise RuntimeError(f"no ptxas of {[t.name for t in tools]} took it: {out.stderr}")
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out.stderr)
    return {
        "registers": int(re.search(r"Used (\d+) registers", out.stderr).group(1)),
        "spill_bytes": int(spills.group(1)) + int(spills.group(2)) if spills else 0,
    }


def check(name, fn, types, consts, warps, stages, arch, cap=None) -> dict:
    """`cap`: the launcher's register cap rule (None: none). As the launcher does
    (`register_cap`), the build is capped only where ptxas alone takes fewer registers."""
    target = GPUTarget("cuda", arch, 32)
    options = {"num_warps": warps, "num_stages": stages}
    kernel = triton.compile(source(fn, types, consts), target=target, options=options)
    report = ptxas_report(kernel.asm["ptx"])
    maxnreg = cap if cap and report["registers"] < cap else None
    if maxnreg:
        options["maxnreg"] = maxnreg
        kernel = triton.compile(source(fn, types, consts), target=target, options=options)
        report = ptxas_report(kernel.asm["ptx"])
    shared = kernel.metadata.shared
    ptx = kernel.asm["ptx"]
    row = {"kernel": name, **consts, "warps": warps, "stages": stages, "cap": cap,
           "maxnreg": maxnreg, "shared_bytes": shared, **report,
           "ptx_sha1": hashlib.sha1(ptx.encode()).hexdigest()[:16]}  # fmt: skip
    if consts.get("PDL"):
        row.update(pdl_order(ptx))
    return row


def pdl_order(ptx: str) -> dict:
    """Where the PDL wait sits: whether the kernel has one, how many global loads (plain or
    cp.async) its PTX has before it and of which kinds (`ld.global.b64`, ...: a vector kind
    would be a tile of data, not an index), and how many stores or atomics. Before the wait
    a kernel may write nothing and read only what the step staged before its first kernel
    (pdl.py): the projections read nothing there, the attention a row's length and block
    table."""
    at = ptx.find("griddepcontrol.wait")
    before = ptx[:at].splitlines() if at >= 0 else []

    def count(pattern: str) -> int:
        return sum(1 for line in before if re.search(pattern, line))

    found = (re.search(r"\bld\.global\S*|cp\.async\S*", line) for line in before)
    kinds = {m.group(0) for m in found if m}
    return {"pdl_wait": at >= 0, "loads_before_wait": count(r"\bld\.global|cp\.async"),
            "load_kinds_before_wait": sorted(kinds),
            "stores_before_wait": count(r"\bst\.global|\batom\.|\bred\.")}  # fmt: skip


def cases(sms: int, pdl: bool = False, arch: int = 86) -> list:
    """(name, kernel, types, constexprs, warps, stages) at 8 rows of the public model, with the
    tiles the launchers pick and each split count they can run; `pdl`: the programmatic
    dependent launch build (the wait, and the weight prefetch before it). Also the prefill
    attention with each tile its launcher picks on a GPU of compute capability `arch`."""
    found = prefill_cases(arch) + rope_cases() + [prompt_gather_case()]
    capability = divmod(arch, 10)
    names = ("M", "N", "K", "INTER", "split_len", "block_size", "split_tokens", "min_programs")
    scalars = dict.fromkeys(names, "i32")
    strides = "i32"
    linear = dict(x_ptr=F16, norm_ptr=F16, w_ptr=F16, res_ptr=F16, out_ptr=F16, ws_ptr=F32,
                  counter_ptr=I32, eps="fp32", **scalars)  # fmt: skip
    for n in ("stride_xm", "stride_wn", "stride_rm", "stride_om"):
        linear[n] = strides
    # the output projection, the down projection (K = 3072, split) and the head; under PDL at 8
    # rows staged as the launcher stages them (`default_stage`), the short ones at their tiles
    stage = default_stage(pdl, 8)
    short = few_row_tiles(8, 768, sms)
    if stage and short_staged_tiles(short[0], 768, 2):
        short = (short[0], *short_staged_tiles(short[0], 768, 2))
    down = few_row_tiles(8, 768, sms, prefer=LONG_K_TILES)
    down_split = default_split_k(host_cdiv(768, down[1]), 3072, down[2], sms)
    for tiles, k, split, norm, residual in (
        (short, 768, 1, False, True), (down, 3072, down_split, False, True),
        (short, 768, 1, True, False),
    ):  # fmt: skip
        bm, bn, bk, warps, stages = tiles
        split_len = split_range(k, bk, split)
        staged = stage_chunks(bm, bn, bk, warps, split_len, 2) if stage else 0
        consts = dict(NORM_CHUNKS=norm_chunks(k, bk, norm), RESIDUAL=residual, SPLIT_K=split,
                      BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PDL=pdl, PREFETCH=pdl,
                      LANES=32 * warps, STAGED=staged)  # fmt: skip
        found.append(("few_row_linear", _few_row_linear_kernel, linear, consts, warps, stages))
    swiglu = dict(x_ptr=F16, norm_ptr=F16, w_ptr=F16, out_ptr=F16, ws_ptr=F32, counter_ptr=I32,
                  stride_xm=strides, stride_wn=strides, stride_om=strides, eps="fp32",
                  **scalars)  # fmt: skip
    # the launcher's tiles at one 16-row tile, and at two where fused layers run them (fused-pdl,
    # Hopper; before it the fused layers stop at 16 rows)
    for rows in (8, 32) if capability >= (9, 0) else (8,):
        tiles = few_row_tiles(rows, 3072, sms, weight_tiles=2, prefer=swiglu_tiles(rows))
        bm, bn, bk, warps, stages = tiles
        for split in (1, 2):
            consts = dict(NORM_CHUNKS=norm_chunks(768, bk), SPLIT_K=split, BLOCK_M=bm,
                          BLOCK_N=bn, BLOCK_K=bk, PDL=pdl, PREFETCH=pdl, LANES=32 * warps,
                          STAGED=0)  # fmt: skip
            found.append(("norm_swiglu", _norm_swiglu_kernel, swiglu, consts, warps, stages))
    qkv = dict(x_ptr=F16, norm_ptr=F16, w_ptr=F16, cos_ptr=F16, sin_ptr=F16, pos_ptr=I64,
               index_ptr=I64,
               q_ptr=F16, k_pool_ptr=F16, v_pool_ptr=F16, ws_ptr=F32, counter_ptr=I32,
               eps="fp32", **scalars)  # fmt: skip
    for n in _norm_qkv_rope_kernel.arg_names:
        if n.startswith("stride_"):
            qkv[n] = strides
    bm, bn, bk, warps, stages = few_row_tiles(8, 1152, sms, weight_tiles=2)
    # each split count with the positions staged before the step; one split with them written
    # by the kernel before (a gathering graph's first layer: read after the wait)
    for split, early in ((1, True), (2, True), (1, False)):
        consts = dict(Q_DIM=768, KV_DIM=768, HEAD_DIM=192, NORM_CHUNKS=norm_chunks(768, bk),
                      SPLIT_K=split, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PDL=pdl, PREFETCH=pdl,
                      LANES=32 * warps, STAGED=0, ROPE_TABLE=True,
                      EARLY_POSITIONS=early)  # fmt: skip
        found.append(("norm_qkv_rope", _norm_qkv_rope_kernel, qkv, consts, warps, stages))
    attention = dict(q_ptr=F16, k_ptr=F16, v_ptr=F16, table_ptr=I64, lens_ptr=I64, out_ptr=F16,
                     m_ptr=F32, l_ptr=F32, acc_ptr=F32, arrivals_ptr=I32, qk_scale_log2="fp32",
                     **scalars)  # fmt: skip
    for n in _decode_split_kernel.arg_names:
        if n.startswith("stride_"):
            attention[n] = strides

    # the tiles, head parts and register cap the launcher picks at 8, 32 and 64 rows on this
    # capability (Hopper: 16-token tiles of two warps with one padded part and at most 168
    # registers, then 16-token tiles of one warp with the head as 128 + 64, then 32-token tiles
    # of one warp with the head as 128 + 64)
    def prefetch_tiles(rows: int, splits: int) -> int:  # as the launcher: only with PDL
        return default_prefetch_tiles(rows, 4, splits, capability) if pdl else 0

    def launch(rows: int, splits: int) -> tuple:
        tiles = default_tiles(rows, 4, 256, sms, capability, splits)
        return (tiles, default_parts(192, rows, 4, sms, capability),
                default_max_registers(tiles, rows, 4, splits, sms, capability))  # fmt: skip

    picked = ((*launch(rows, 16), rows if long_split_programs(rows, 4, sms, capability) else 1,
               prefetch_tiles(rows, 16)) for rows in (8, 32, 64))  # fmt: skip
    picked = [(*shape, 16) for shape in dict.fromkeys(picked)]
    # and the graphs of 4 and 8 rows past LONG_CONTEXT where they have more splits (Hopper: 49
    # splits with 16-token tiles of two warps; 33 splits with 16-token tiles of one warp)
    for rows in (4, 8):
        splits = choose_num_splits(4096, rows, 4, sms, capability)
        if splits > 16:
            picked.append((*launch(rows, splits), 1, prefetch_tiles(rows, splits), splits))
    for (block_n, warps, stages), (da, db), regs, block_b, ahead, splits in picked:
        consts = dict(GROUP=1, HEAD_DIM=192, NUM_SPLITS=splits,
                      BLOCK_S=triton.next_power_of_2(splits), BLOCK_G=1, BLOCK_N=block_n,
                      BLOCK_DA=da, BLOCK_DB=db, USE_DOT=False, PDL=pdl, PREFETCH=ahead,
                      LONG_SPLITS=block_b > 1, BLOCK_B=block_b)  # fmt: skip
        for offsets in (True, False):  # a slab's table of first tokens, a paged one's blocks
            found.append(("decode_attention", _decode_split_kernel, attention,
                          {**consts, "OFFSETS": offsets}, warps, stages, regs))  # fmt: skip
    return found


def prefill_cases(arch: int) -> list:
    """The scheduled prefill attention (as the prefill graphs run it) at head_dim 192, with the
    tile of a short, a mid-size and a long call (one tile before Hopper)."""
    types = dict(q_ptr=F16, k_ptr=F16, v_ptr=F16, o_ptr=F16, cu_ptr="*i32", sched_ptr=I64,
                 n_sched="i32", qk_scale_log2="fp32")  # fmt: skip
    types.update({n: "i32" for n in _varlen_prefill_kernel.arg_names if n.startswith("stride_")})
    tiles = {prefill_tiles(192, divmod(arch, 10), tokens) for tokens in (512, 4096, 8192)}
    da, db = head_parts(192)
    return [("prefill_attention", _varlen_prefill_kernel, types,
             dict(GROUP=1, HEAD_DIM=192, BLOCK_M=bm, BLOCK_N=bn, BLOCK_DA=da, BLOCK_DB=db,
                  SCHEDULED=True), warps, prefill_stages(divmod(arch, 10)))
            for bm, bn, warps in sorted(tiles)]  # fmt: skip


def rope_cases() -> list:
    """The Triton stack's RoPE + cache write (prefill, and decode steps past the fused layers)
    at the public model's heads, with the launch of a decode step and of a prefill."""
    types = {n: F16 for n in _rope_cache_write_kernel.arg_names if n.endswith("_ptr")}
    types.update({n: "i32" for n in _rope_cache_write_kernel.arg_names if n.startswith("stride_")})
    types.update(index_ptr=I64, pos_ptr=I64, tokens="i32")
    launches = ((tokens, *rope_launch(tokens)) for tokens in (64, 512))
    return [("rope_cache_write", _rope_cache_write_kernel, types,
             dict(HEADS=4, KV_HEADS=4, HEAD_DIM=192, BLOCK_T=block_t, BLOCK_HQ=4, BLOCK_HK=4,
                  BLOCK_D=256, STORE_K=tokens > 64, PDL=False, ROPE_TABLE=True), warps, 1)
            for tokens, block_t, warps in launches]  # fmt: skip


def prompt_gather_case() -> tuple:
    """A prefill graph's first kernel at bucket 512 (the prompts gathered, the metadata copied
    from pinned memory, the check and the embedding)."""
    types = dict(host_ptr=I64, meta_ptr=I64, base_ptr=I64, extremes_ptr=I64, embed_ptr=F16,
                 x_ptr=F16, vocab="i32", size="i32", n_at="i32", source_at="i32", rows="i32",
                 hidden="i32", stride_e="i32", stride_x="i32")  # fmt: skip
    # 1,345 metadata slots over 512 rows' 32 programs; hidden 768
    consts = dict(BLOCK=512, ROWS=ROWS, COLS=EMBED_COLS, META_BLOCK=64)
    return ("prompt_gather", _gather_embed_kernel, types, consts, 4, 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--arch", type=int, default=86, help="compute capability, e.g. 86 or 90")
    p.add_argument("--sms", type=int, default=82, help="SM count the launchers' tiles assume")
    p.add_argument(
        "--pdl",
        action="store_true",
        help="the programmatic dependent launch build (sm_90+, Triton 3.3+)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="build the kernels this many at a time in threads, as the kernel searches do",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.threads < 1:
        p.error(f"--threads {args.threads}: at least 1")
    found = cases(args.sms, args.pdl, args.arch)

    def one(case: tuple) -> dict:
        name, fn, types, consts, warps, stages, *regs = case
        return check(name, fn, types, consts, warps, stages, args.arch, *regs)

    with ThreadPoolExecutor(args.threads) as pool:
        rows = list(pool.map(one, found))
    for row in rows:
        print(json.dumps(row), flush=True)
    meta = {"triton": triton.__version__, "arch": args.arch, "sms": args.sms, "pdl": args.pdl}
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": rows}, indent=1))
    return 1 if any(r["spill_bytes"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
