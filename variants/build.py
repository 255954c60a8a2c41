"""Library entry: an engine for a Variant, built as a trial builds it: its standalone engine.py
rendered (`render_engine`, the kernels on the lines a trial's file has them, so Triton's compile
cache serves both), imported from the file as the grader imports it, and its `create_engine`."""

import shutil
import tempfile
import weakref
from pathlib import Path

from evaluator.engine_loader import load_engine_module
from variants.render import render_engine


def build_engine(
    config: dict,
    weight_dir: str,
    device: str,
    variant,
    memory_budget_gib=None,
    knobs=None,
    few_row_knobs=None,
    prefill_knobs=None,
):
    """`variant`'s engine on `weight_dir`, its file in a fresh temporary folder that lives as long
    as the engine (Triton reads a kernel's source from its file). `knobs`, `few_row_knobs`,
    `prefill_knobs`: the kernel searches' tables (`render_source`)."""
    folder = Path(tempfile.mkdtemp(prefix="engine-"))
    try:
        path = render_engine(
            variant, folder / "engine.py", "", memory_budget_gib,
            knobs=knobs, few_row_knobs=few_row_knobs, prefill_knobs=prefill_knobs,
        )  # fmt: skip
        module = load_engine_module(path)
        # the budget as given: the file rounds MEMORY_BUDGET_GIB to 0.01 GiB for its reader
        module.MEMORY_BUDGET_GIB = memory_budget_gib
        engine = module.create_engine(config, weight_dir, device)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    weakref.finalize(engine, shutil.rmtree, folder, ignore_errors=True)
    return engine
