"""Planted fault: removal pops a slot list, so later requests read another request's state."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from evaluator.engine_loader import load_engine_module  # noqa: E402

RecomputingEngine = load_engine_module(
    Path(__file__).with_name("reference_engine.py")
).RecomputingEngine


class ShiftingSlots:
    """A request id -> slot index map over a list of token histories."""

    def __init__(self):
        self.slots: list = []
        self.slot_of: dict[int, int] = {}

    def __contains__(self, rid):
        return rid in self.slot_of

    def __getitem__(self, rid):
        return self.slots[self.slot_of[rid]]

    def __setitem__(self, rid, tokens):
        if rid not in self.slot_of:
            self.slot_of[rid] = len(self.slots)
            self.slots.append(tokens)
        self.slots[self.slot_of[rid]] = tokens

    def __delitem__(self, rid):
        # BUG: popping shifts every later slot down by one, but slot_of is not renumbered.
        self.slots.pop(self.slot_of.pop(rid))


class WrongRemoveEngine(RecomputingEngine):
    def __init__(self, model_config, weight_dir, device="cuda", dtype=None):
        super().__init__(model_config, weight_dir, device, dtype)
        self.history = ShiftingSlots()


def create_engine(model_config, weight_dir, device="cuda", dtype=None):
    return WrongRemoveEngine(model_config, weight_dir, device, dtype)
