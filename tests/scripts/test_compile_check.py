"""scripts/compile_check.py: the decode-step kernels, the prefill attention, the RoPE + cache
write and the graphs' first kernels compile for an RTX 3090 (sm_86) without a GPU, with the
launchers' tiles, and ptxas reports no spills and shared memory within a block."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed")
if not any((Path(triton.__file__).parent / "backends" / "nvidia" / "bin").glob("ptxas*")):
    pytest.skip("this Triton has no NVIDIA backend tools", allow_module_level=True)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compile_check.py"
RTX_3090_SHARED = 99 * 1024  # a block's shared memory on sm_86


def test_decode_kernels_compile_for_sm86_without_spills(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, not interpret
    out = tmp_path / "check.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--arch", "86", "--json", str(out)],
                         env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.exists(), run.stderr[-2000:]
    rows = json.loads(out.read_text())["results"]
    assert {r["kernel"] for r in rows} == {
        "few_row_linear", "norm_swiglu", "norm_qkv_rope", "decode_attention",
        "prefill_attention", "rope_cache_write", "prompt_gather",
    }  # fmt: skip
    # before Hopper one prefill tile, whatever the call's size: 32 x 32 over 8 warps
    prefill = [r for r in rows if r["kernel"] == "prefill_attention"]
    assert [(r["BLOCK_M"], r["BLOCK_N"], r["warps"]) for r in prefill] == [(32, 32, 8)]
    assert [r for r in rows if r["spill_bytes"]] == []
    assert all(0 < r["registers"] <= 255 and r["shared_bytes"] <= RTX_3090_SHARED for r in rows)
    # the down projection on 82 SMs: 24 tiles of 32 columns, 7 splits (two programs an SM)
    assert {r["SPLIT_K"] for r in rows if r["kernel"] == "few_row_linear"} == {1, 7}
    assert run.returncode == 0


def test_the_pdl_build_waits_before_it_reads_an_earlier_kernel(tmp_path):
    """Hopper's PDL build (sm_90, the installed Triton): every kernel waits; before the wait
    nothing is stored, the projections load nothing but the staged ones their weight (which no
    kernel writes) and norm + QKV + RoPE its rows' positions, and the attention loads what is
    staged before the step's first kernel: the row's length and its block table (and at 64
    rows every row's length, which sizes the splits)."""
    from variants.kernels.pdl import triton_has_pdl

    if not triton_has_pdl():
        pytest.skip("this Triton cannot launch with PDL")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "check.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--arch", "90", "--sms", "132", "--pdl", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.exists(), run.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    no_pdl = ("prefill_attention", "rope_cache_write", "prompt_gather")
    rows = [r for r in results if r["kernel"] not in no_pdl]
    assert len(rows) == 20 and all(r["pdl_wait"] and r["stores_before_wait"] == 0 for r in rows)
    # Hopper's decode attention tiles: 16 tokens, two warps at 8 rows and one at 32; 32 tokens
    # of one warp at 64 rows (a program per SM); then the graphs of 4 and 8 rows past
    # LONG_CONTEXT (49 splits of two-warp tiles, 33 of one-warp tiles); the 16-token tiles
    # below a quarter of an SM a program with ptxas capped at 168 registers where the grid
    # holds at most 8 warps an SM (not 49 splits of two warps at 4 rows) and ptxas alone
    # takes fewer
    # each built for a slab's table of first tokens and a paged one's blocks, alike
    both = [r for r in rows if r["kernel"] == "decode_attention"]
    assert [r["OFFSETS"] for r in both] == [True, False] * 5
    drop = ("OFFSETS", "registers", "maxnreg", "ptx_sha1")
    assert [{k: v for k, v in r.items() if k not in drop} for r in both[::2]] == [
        {k: v for k, v in r.items() if k not in drop} for r in both[1::2]
    ]
    attention = both[1::2]
    assert [(r["BLOCK_N"], r["warps"]) for r in attention] == [
        (16, 2),
        (16, 1),
        (32, 1),
        (16, 2),
        (16, 1),
    ]
    assert [r["NUM_SPLITS"] for r in attention] == [16, 16, 16, 49, 33]
    assert [r["cap"] for r in attention] == [168, None, None, None, 168]
    for r in both:  # capped only where ptxas alone takes fewer registers
        if r["maxnreg"]:
            assert r["maxnreg"] == r["cap"] and r["registers"] <= r["cap"]
        else:
            assert r["cap"] is None or r["registers"] >= r["cap"]
    # the projections load nothing before the wait; the attention the length and the block
    # table entries of the tiles it prefetches (one gather, which the two-warp build with two
    # tiles and the 33-split build issue as two load instructions), and at 64 rows the
    # lengths of all rows too (two more); each a scalar index load, none a vector of data
    unstaged = [r for r in rows if r["kernel"] != "decode_attention" and not r.get("STAGED")]
    assert {r["loads_before_wait"] for r in unstaged if r["kernel"] != "norm_qkv_rope"} == {0}
    # norm + QKV + RoPE loads its rows' positions there (staged before the step: the rows of
    # the cos / sin tables it reads), scalar index loads, nothing else; after the kernel that
    # wrote them (a gathering graph's first layer), nothing
    qkv = [r for r in unstaged if r["kernel"] == "norm_qkv_rope"]
    assert [r["EARLY_POSITIONS"] for r in qkv] == [True, True, False]
    assert all(1 <= r["loads_before_wait"] <= 2 for r in qkv[:2])
    assert {k for r in qkv[:2] for k in r["load_kinds_before_wait"]} == {"ld.global.b64"}
    assert qkv[2]["loads_before_wait"] == 0
    # the staged projections at 8 rows (output, down, head) load their weight share there and
    # nothing else (no x): one 16-byte vector a thread per 16 bytes of their chunks
    staged = [r for r in rows if r.get("STAGED")]
    assert [(r["kernel"], r["STAGED"]) for r in staged] == [("few_row_linear", 3)] * 3
    for r in staged:
        share = r["STAGED"] * r["BLOCK_N"] * r["BLOCK_K"] * 2  # bytes of float16 weight
        assert r["loads_before_wait"] == share // (32 * r["warps"] * 16)
        assert r["load_kinds_before_wait"] == ["ld.global.v4.b32"]
    assert [r["loads_before_wait"] for r in attention] == [3, 2, 5, 2, 3]
    assert [r["PREFETCH"] for r in attention] == [2, 2, 2, 1, 1]
    assert {k for r in attention for k in r["load_kinds_before_wait"]} == {"ld.global.b64"}
    assert [r["LONG_SPLITS"] for r in attention] == [False, False, True, False, False]


SPECIALIZED = """
import json, sys
sys.path.insert(0, sys.argv[1])
import compile_check as check
import triton
from triton.backends.compiler import GPUTarget
attention = next(c for c in check.cases(132, arch=90) if c[0] == "decode_attention")
_, fn, types, consts, warps, stages, *_ = attention
options = {"num_warps": warps, "num_stages": stages}
kernel = triton.compile(check.source(fn, types, consts), target=GPUTarget("cuda", 90, 32),
                        options=options)
print(json.dumps({"marked": check.aligned(fn, types), "ptx": kernel.asm["ptx"]}))
"""


def test_a_build_is_specialized_as_a_launch_is():
    """Pointers and strides are marked divisible by 16, as a launch at the public shapes marks
    them (not the block table's row stride, 1 on a slab): the attention's keys and values then
    load as 16-byte vectors, where an unmarked build loads them 2 bytes at a time. (In a
    process of its own: this one's kernels are the interpreter's.)"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", SPECIALIZED, str(SCRIPT.parent)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert "k_ptr" in found["marked"] and "stride_kt" in found["marked"]
    assert "stride_tb" not in found["marked"] and "block_size" not in found["marked"]
    assert "ld.global.v4.b32" in found["ptx"]


def test_kernels_built_side_by_side_in_threads_are_the_serial_builds(tmp_path):
    """The kernel searches compile a move's launches in threads (`build_all`); every kernel
    built 8 at a time, each from a cold cache of its own, is the serial build: the same PTX,
    registers and shared memory (users' Triton 3.0 checked the same way by hand, PERF)."""
    rows = {}
    for threads in (1, 8):
        out, cache = tmp_path / f"{threads}.json", tmp_path / f"cache{threads}"
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = str(cache)
        cmd = [sys.executable, str(SCRIPT), "--threads", str(threads), "--json", str(out)]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert out.exists(), run.stderr[-2000:]
        rows[threads] = json.loads(out.read_text())["results"]
    assert len(rows[1]) > 10 and all(len(r["ptx_sha1"]) == 16 for r in rows[1])
    assert rows[8] == rows[1]
