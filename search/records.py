"""A trial as plain data: what selection, the results log and the report read.

Records come from an Optuna study or, when Optuna is missing, straight from the trial runner, so
nothing downstream of the search needs Optuna. Measurement keys are the trial's user attributes:
`tokens_per_s`, `peak_mib`, `tps_<trace>`, ...; the full-protocol re-measurement adds `full_*`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Record:
    """`status`: ok (correct, measured), infeasible (wrong, or too close to the tolerance), failed
    (crashed, hung, out of memory), duplicate (same variant as an earlier trial), skipped (over
    a shared trial target), running, waiting (queued), fallback (a default never measured)."""

    number: int
    status: str
    variant: dict | None
    attrs: dict = field(default_factory=dict)
    values: tuple[float, ...] | None = None

    @property
    def feasible(self) -> bool:
        if self.status not in ("ok", "duplicate") or self.values is None:
            return False
        return all(c <= 0 for c in self.attrs.get("constraint") or [1.0])

    @property
    def has_full(self) -> bool:
        return self.attrs.get("full_tokens_per_s") is not None

    @property
    def tokens_per_s(self) -> float:
        """Full-protocol throughput when measured, else the cheap screening number."""
        value = (
            self.attrs.get("full_tokens_per_s") if self.has_full else self.attrs.get("tokens_per_s")
        )
        return float(value or 0.0)

    @property
    def screening_tokens_per_s(self) -> float:
        """The screening (quick protocol) throughput, which every measured trial has."""
        return float(self.attrs.get("tokens_per_s") or 0.0)

    @property
    def peak_mib(self) -> float:
        value = self.attrs.get("full_peak_mib") if self.has_full else self.attrs.get("peak_mib")
        return float(value or 0.0)

    @property
    def name(self) -> str:
        return self.attrs.get("variant_name") or "?"

    def trace_numbers(self, prefix: str = "") -> dict[str, dict]:
        """Per trace `{tps, decode_tps, floor_eff, seconds}` from the attrs (`full_` numbers when
        `prefix="full_"`)."""
        rows: dict[str, dict] = {}
        for key, value in self.attrs.items():
            for kind in ("decode_tps", "tps", "floor_eff", "seconds"):
                head = f"{prefix}{kind}_"
                if key.startswith(head):
                    rows.setdefault(key[len(head) :], {})[kind] = value
        return rows


def finite(value):
    """JSON-safe: non-finite floats become None (storages and the dashboard choke on them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def geometric_mean(values: list[float]) -> float:
    if not values or min(values) <= 0:
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))
