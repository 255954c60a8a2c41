"""The component library: an engine core and interchangeable components, assembled by Variant."""

from variants.build import build_engine
from variants.variant import Variant

__all__ = ["Variant", "build_engine"]
