"""Programmatic dependent launch (PDL, Hopper and newer): a kernel of a decode step starts while
the kernel before it is still running, prefetches its own weights into L2, then waits for it.

Inside a CUDA graph each kernel boundary of a decode step costs a launch's latency, and each
kernel then waits on HBM round trips for weights that no earlier kernel writes. Launched with
PDL, a kernel's programs become resident as soon as every program of the kernel before it has
passed its own wait (`wait_previous`), so only one kernel runs ahead: a second one's prefetch
would compete with the attention's reads (a slower step). Before its wait a
program may read nothing an earlier kernel writes and write nothing at all: it only asks for
its weight bytes (`prefetch_l2`, a hint that cannot change a result) or, staged, loads them
(no kernel writes a weight). After the wait everything earlier in the stream is
complete and visible.

Needs compute capability >= 9.0 and a Triton with grid dependency control and the `launch_pdl`
launch option (3.3 and newer); elsewhere the search never offers it. The instructions are inline
PTX that Triton's interpreter cannot run, so there the launchers refuse PDL."""

import dataclasses
import functools

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # an older Triton: never called (launch_options refuses PDL there)

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass

    _HAS_GDC = False
else:
    _HAS_GDC = True


@triton.jit
def wait_previous(PDL: tl.constexpr):
    """Wait until the kernel before has finished and its writes are visible, then let the
    kernel after this one launch. A no-op without PDL."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


def _launch_option() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "launch_pdl" in {f.name for f in dataclasses.fields(CUDAOptions)}


@functools.cache
def triton_has_pdl() -> bool:
    """Whether the installed Triton can both emit the wait and launch with the attribute."""
    return _HAS_GDC and _launch_option()


def pdl_supported(device) -> bool:
    """Whether kernels on this device may launch with PDL: CUDA, capability >= 9.0, and the
    Triton support above."""
    device = torch.device(device)
    if device.type != "cuda" or not triton_has_pdl():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index) >= (9, 0)


def launch_options(pdl: bool, device) -> dict:
    """The launch keyword arguments of a kernel launched with (or without) PDL."""
    if not pdl:
        return {}
    if not pdl_supported(device):
        raise ValueError(
            f"programmatic dependent launch needs a CUDA device of capability >= 9.0 and a Triton "
            f"with launch_pdl (3.3+); {torch.device(device)} with Triton {triton.__version__} "
            f"has not"
        )
    return {"launch_pdl": True}
