"""Eager execution: every op launches as PyTorch dispatches it. No warm-up cost; on a GPU a
decode step is launch bound (hundreds of small kernels)."""


def run_eager(fn, variant):
    return fn
