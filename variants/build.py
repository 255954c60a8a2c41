"""Library entry: build an engine for a Variant from the installed package (no rendering)."""

import importlib

from variants.components import assembly_path, component_paths


def resolve(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def build_engine(config: dict, weight_dir: str, device: str, variant, memory_budget_gib=None):
    parts = {key: resolve(path) for key, path in component_paths(variant).items()}
    return resolve(assembly_path(variant))(
        config, weight_dir, device, variant, **parts, memory_budget_gib=memory_budget_gib
    )
