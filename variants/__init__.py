"""The component library: an engine core and interchangeable components, assembled by Variant."""

from variants.variant import Variant


def build_engine(config: dict, weight_dir: str, device: str, variant: Variant, **options):
    """`options`: assemble_engine's own (`memory_budget_gib`)."""
    from variants.build import build_engine as _build

    return _build(config, weight_dir, device, variant, **options)


__all__ = ["Variant", "build_engine"]
