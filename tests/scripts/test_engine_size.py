"""The written engine's size bar (issue #41): every assembly a CPU's search may write for the
course's target (its config in the course's keys, its weights a course-layout model.pt) is at
most 700 lines of code, comments and docstrings aside, counted as scripts/engine_size.py counts
them."""

import json
import sys
from pathlib import Path

from variants.probe import probe_capabilities
from variants.registry import AXES
from variants.render import render_source
from variants.variant import Variant

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.engine_size import code_lines  # noqa: E402

COURSE_CONFIG = Path(__file__).resolve().parents[2] / "target" / "model_config.json"
# what only sets a constant of the file (a block's tokens, the first cache's), not its code
CONSTANTS = ("block_size", "cache_tokens")


def assemblies(caps) -> list:
    """Every variant the search space holds on this machine (search/setup.py's walk), one
    value of each constant-only axis."""
    found = []

    def walk(index: int, partial: dict) -> None:
        if index == len(AXES):
            found.append(Variant.from_dict(partial))
            return
        axis = AXES[index]
        if not axis.applies(partial):
            return walk(index + 1, partial)
        choices = caps.choices(axis.name, partial)
        for choice in choices[:1] if axis.name in CONSTANTS else choices:
            walk(index + 1, {**partial, axis.name: choice})

    walk(0, {})
    return found


def test_every_engine_a_cpu_search_may_write_is_at_most_700_lines():
    caps = probe_capabilities("cpu", json.loads(COURSE_CONFIG.read_text()))
    sizes = {v.name: code_lines(render_source(v, weights="course")) for v in assemblies(caps)}
    assert len(sizes) > 20  # caches, attentions, backends, execution modes, fusions
    assert all(counts["kernels"] == 0 for counts in sizes.values())
    over = {name: c["rest"] for name, c in sizes.items() if c["rest"] > 700}
    assert not over, f"over 700 code lines: {over}"
