"""The search space: the variant registry walked define-by-run, filtered by the capability probe.

An axis is suggested only when it applies to the choices made so far and this machine offers more
than one value for it. Optuna forbids one parameter name with two different choice lists, so when
earlier choices narrow an axis the parameter gets a qualified name (`sdpa_backend[auto|math]`).
"""

from __future__ import annotations

from variants.registry import AXES
from variants.variant import Variant


class EmptySpaceError(RuntimeError):
    """Some reachable assembly leaves an axis with no valid choice on this machine."""


class SearchSpace:
    def __init__(self, caps):
        self.caps = caps
        self.offered: dict[str, tuple] = {axis.name: () for axis in AXES}
        self.size = self._walk(0, {})
        self.offered = {name: values for name, values in self.offered.items() if values}

    def _walk(self, index: int, partial: dict) -> int:
        """Record every choice reachable here; return how many complete variants there are."""
        if index == len(AXES):
            return 1
        axis = AXES[index]
        if not axis.applies(partial):
            return self._walk(index + 1, partial)
        choices = self.caps.choices(axis.name, partial)
        seen = self.offered[axis.name]
        self.offered[axis.name] = seen + tuple(c for c in choices if c not in seen)
        return sum(self._walk(index + 1, {**partial, axis.name: c}) for c in choices)

    def param_name(self, axis_name: str, choices: list) -> str:
        full = [c for c in self.offered[axis_name] if c in choices]
        if full == list(self.offered[axis_name]):
            return axis_name
        return f"{axis_name}[{'|'.join(str(c) for c in full)}]"

    def _choose(self, pick) -> tuple[Variant, dict]:
        partial: dict = {}
        params: dict = {}
        for axis in AXES:
            if not axis.applies(partial):
                continue
            choices = self.caps.choices(axis.name, partial)
            if not choices:
                raise EmptySpaceError(f"no valid {axis.name} here after {partial}")
            if len(choices) == 1:
                partial[axis.name] = choices[0]
                continue
            name = self.param_name(axis.name, choices)
            partial[axis.name] = params[name] = pick(axis.name, name, choices)
        return Variant.from_dict(partial), params

    def suggest(self, trial) -> Variant:
        """The variant of an Optuna trial, suggesting one parameter per open axis."""
        variant, _ = self._choose(
            lambda axis, name, choices: trial.suggest_categorical(name, choices)
        )
        return variant

    def params_for(self, variant: Variant) -> dict:
        """The parameters `suggest` would record for `variant` (for `enqueue_trial`)."""
        reason = self.caps.why_invalid(variant)
        if reason is not None:
            raise ValueError(f"{variant.name} is not offered here: {reason}")
        values = variant.to_dict()
        return self._choose(lambda axis, name, choices: values[axis])[1]

    def canonical(self, variant: Variant) -> Variant:
        """`variant` with the fields of axes that do not apply reset to their defaults."""
        values = variant.to_dict()
        return self._choose(lambda axis, name, choices: values[axis])[0]

    def describe(self) -> list[tuple[str, tuple]]:
        """(axis, choices offered on this machine) in registry order."""
        return [(axis.name, self.offered[axis.name]) for axis in AXES if axis.name in self.offered]
