"""Fixtures of the kernel searches' tests: the course's model, a kernel's launches recorded,
the bench of a search's loop without a GPU, an engine with a table written and built."""

import json
from pathlib import Path

import pytest
import torch

from variants.spec import ModelSpec


@pytest.fixture
def course():
    """The course's config and its spec (head_dim 192: two parts)."""
    config = json.loads((Path(__file__).parents[2] / "target" / "model_config.json").read_text())
    return config, ModelSpec.from_config(config)


@pytest.fixture
def launch_recorder():
    """(launches, Recorder): a stand-in for a Triton kernel (`kernel[grid](...)`) that runs
    nothing and records each launch's grid and every argument but the tensors in `launches`."""
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                plain = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
                launches.append((grid, plain))

            return launch

    return launches, Recorder


class FakeBench:
    """Times from a table of knob values (each (knob, value) it holds takes that much off a
    1 ms launch); every launch right unless `wrong` (a large error), `refused` raise as a launch
    the GPU cannot take (checked or built). `events`: ("build" | "error" | "time", knobs) in
    the order they came."""

    def __init__(self, faster: dict, wrong=(), refused=()):
        self.faster, self.wrong, self.refused = faster, wrong, refused
        self.timed, self.events = [], []

    def build(self, knobs):
        self.events.append(("build", dict(knobs)))
        if any(knobs[k] == v for k, v in self.refused):
            raise RuntimeError("out of resource: shared memory")

    def error(self, knobs):
        self.events.append(("error", dict(knobs)))
        if any(knobs[k] == v for k, v in self.refused):
            raise RuntimeError("out of resource: shared memory")
        return 1.0 if any(knobs[k] == v for k, v in self.wrong) else 1e-3

    def time_ms(self, knobs):
        self.timed.append(dict(knobs))
        self.events.append(("time", dict(knobs)))
        return 1.0 - sum(self.faster.get((k, v), 0.0) for k, v in knobs.items())


@pytest.fixture
def fake_bench():
    """`FakeBench`, the class (a test may derive its own)."""
    return FakeBench


@pytest.fixture
def written_engine(tiny_config, sharp_weights, tmp_path):
    """`make(variant, scenario, **tables)` -> (the engine file's text, its module, the gaps):
    a variant with kernel tables rendered, imported and built on the CPU, and built by the
    library with the same tables; each engine's largest gap to the reference over
    `scenario(engine, reference, vocab)`."""
    from evaluator.engine_loader import load_engine_module
    from evaluator.reference_model import ReferenceModel
    from variants.build import build_engine
    from variants.render import render_engine

    def make(variant, scenario, **tables):
        path = render_engine(variant, tmp_path / "engine.py", **tables)
        module = load_engine_module(path)
        engines = (
            module.create_engine(tiny_config, sharp_weights, "cpu"),
            build_engine(tiny_config, sharp_weights, "cpu", variant, **tables),
        )
        ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
        gaps = [scenario(e, ref, tiny_config["vocab_size"]) for e in engines]
        return path.read_text(), module, gaps

    return make


@pytest.fixture
def kernel_lines():
    """`lines(source)`: where an engine's Triton kernels stand, (line index, line) each (their
    lines are in Triton's cache key: a table must not move them)."""
    return lambda source: [
        (i, line) for i, line in enumerate(source.splitlines()) if line.startswith("@triton.jit")
    ]
