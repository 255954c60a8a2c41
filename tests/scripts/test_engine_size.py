"""The written engine's size bar (issue #41): every assembly a CPU's search may write for the
course's target (its config in the course's keys, its weights a course-layout model.pt) is at
most 780 lines of code, comments and docstrings aside, counted as scripts/engine_size.py counts
them. (700 until the engine computed more than LLaMA: the model class and the other
architectures' parts, which an engine carries whatever model it runs, cost it about 80.)"""

import dataclasses
import json
import sys
from pathlib import Path

from search.setup import SearchSpace
from variants.probe import probe_capabilities
from variants.render import render_source
from variants.variant import Variant

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.engine_size import code_lines  # noqa: E402

COURSE_CONFIG = Path(__file__).resolve().parents[2] / "target" / "model_config.json"


def test_every_engine_a_cpu_search_may_write_is_at_most_780_lines():
    caps = probe_capabilities("cpu", json.loads(COURSE_CONFIG.read_text()))
    # a block's tokens and the first cache's set a constant of the file, not its code
    default = Variant()
    shapes = {
        dataclasses.replace(v, block_size=default.block_size, cache_tokens=default.cache_tokens)
        for v in SearchSpace(caps).assemblies
    }
    sizes = {v.name: code_lines(render_source(v, weights="course")) for v in shapes}
    assert len(sizes) > 20  # caches, attentions, backends, execution modes, fusions
    assert all(counts["kernels"] == 0 for counts in sizes.values())
    over = {name: c["rest"] for name, c in sizes.items() if c["rest"] > 780}
    assert not over, f"over 780 code lines: {over}"
