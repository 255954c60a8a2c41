"""Library entry: build an engine for a Variant from the installed package (no rendering)."""

import functools
import importlib

from variants.components import Ref, Table, assembly_path, component_parts, model_options


def resolve(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def bind(path: str, options: dict):
    """The component at `path` with its options bound (a Ref option resolved to its component)."""
    if not options:
        return resolve(path)
    values = {k: resolve(v.path) if isinstance(v, Ref) else v for k, v in options.items()}
    values = {k: v.value if isinstance(v, Table) else v for k, v in values.items()}
    return functools.partial(resolve(path), **values)


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
    parts = component_parts(variant, knobs, few_row_knobs, prefill_knobs)
    parts = {key: bind(path, options) for key, (path, options) in parts.items()}
    return resolve(assembly_path(variant))(
        config, weight_dir, device, **parts, **model_options(variant),
        memory_budget_gib=memory_budget_gib,
    )  # fmt: skip
