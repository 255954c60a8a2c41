"""Fixtures of the variants tests: one torch thread, the tiny ModelSpec, the CPU variant list,
an engine assembled from the library's classes, decode steps checked against the reference.

The tensors here are tiny, so a second intra-op thread only adds contention on the 2-core CI
machine (measured: the same check_engine run took 0.6 s with 1 thread, 5 s with 2 threads on a
loaded box). `cpu_variant` parametrizes a test over every variant the CPU probe offers.
"""

import dataclasses
import functools
import importlib
import json
from pathlib import Path

import pytest
import torch

from evaluator.reference_model import ReferenceModel
from variants.components import Ref, Table, assembly_path, component_parts, model_options
from variants.probe import probe_capabilities
from variants.registry import AXES
from variants.spec import ModelSpec
from variants.variant import Variant

TINY_CONFIG_PATH = Path(__file__).resolve().parents[1] / "data" / "tiny_config.json"


def enumerate_variants(caps) -> list:
    """Every Variant the probe allows, walking AXES like the search does (define-by-run): an axis
    that does not apply keeps the Variant default."""
    defaults = Variant().to_dict()
    partials = [{}]
    for axis in AXES:
        grown = []
        for partial in partials:
            if not axis.applies(partial):
                grown.append({**partial, axis.name: defaults[axis.name]})
                continue
            for value in caps.choices(axis.name, partial):
                grown.append({**partial, axis.name: value})
        partials = grown
    return [Variant.from_dict(p) for p in partials]


def cpu_variants(include_compile: bool = False) -> list:
    config = json.loads(TINY_CONFIG_PATH.read_text())
    found = enumerate_variants(probe_capabilities("cpu", config))
    return [v for v in found if include_compile or v.execution != "compile"]


def pytest_generate_tests(metafunc):
    if "cpu_variant" in metafunc.fixturenames:
        found = cpu_variants()
        metafunc.parametrize("cpu_variant", found, ids=[v.name for v in found])


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Module scope: autouse fixtures run before the module's other fixtures, so module-scoped
    expectations are computed with the same thread count (and summation order) as the tests."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_spec(tiny_config) -> ModelSpec:
    return ModelSpec.from_config(tiny_config)


@pytest.fixture(scope="session")
def cpu_caps(tiny_config):
    return probe_capabilities("cpu", tiny_config)


@pytest.fixture
def fake_cuda_caps(cpu_caps):
    """Capabilities of an sm_90 GPU with torch 2.11, built by hand: the CUDA-only rules of the
    registry are plain functions of these fields, so they can be checked on a CPU machine."""

    def make(**changes):
        base = dataclasses.replace(
            cpu_caps,
            device="cuda:0",
            device_type="cuda",
            gpu_name="NVIDIA H200",
            compute_capability=(9, 0),
            torch_version=(2, 11),
            triton_version=(3, 5),
            sdpa_backends=("auto", "math", "efficient", "flash", "cudnn"),
            has_flex=True,
            has_enable_gqa=True,
            can_compile=True,
            head_dim=192,
            config_dtype="float16",
            has_pdl=True,
        )
        return dataclasses.replace(base, **changes)

    return make


@pytest.fixture(scope="session")
def all_cpu_variants() -> list:
    """Every CPU-valid variant, compiled ones included."""
    return cpu_variants(include_compile=True)


class EagerReplay:
    """Stands in for a captured decode graph: a replay runs the captured body on the static
    buffers (what a graph replays), so the CPU exercises them."""

    def __init__(self, graphs, batch, ctx):
        self.graphs, self.batch, self.ctx = graphs, batch, ctx

    def replay(self):
        self.graphs._body(self.batch, self.ctx)


def resolve(path: str):
    """The library's component at `module:name`."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def assembled_engine(config: dict, weight_dir: str, device: str, variant, **tables):
    """`variant`'s engine assembled in this process from the library's own classes (`tables`:
    component_parts' kernel tables): what a test runs the library's graph runners on (emulated
    on the CPU) or patches the library's modules for. build_engine runs the variant's rendered
    file instead, which keeps only what its own assembly calls."""

    def bound(path: str, options: dict):
        values = {
            k: resolve(v.path) if isinstance(v, Ref) else v.value if isinstance(v, Table) else v
            for k, v in options.items()
        }
        return functools.partial(resolve(path), **values) if values else resolve(path)

    parts = component_parts(variant, **tables)
    parts = {key: bound(path, options) for key, (path, options) in parts.items()}
    assemble = resolve(assembly_path(variant))
    return assemble(config, weight_dir, device, **parts, **model_options(variant))


@pytest.fixture(scope="session")
def library_engine():
    return assembled_engine


def emulated_decode_graphs(engine, largest, check_ids=None, warm=False, gathered_embedding=None):
    """The engine's decode runner, its buckets "captured" as eager replays (listed in
    `graphs.captured`; `warm`: each body run once first, as a capture does); the engine's decode
    steps routed through it. `check_ids` False: the check of the ids left to the engine, as
    where PyTorch cannot capture it (DeferredRangeCheck.in_graph)."""
    from variants.execution.cuda_graphs import DecodeGraphs

    if check_ids is not None:
        engine.token_check.in_graph = check_ids
    graphs = DecodeGraphs(
        engine, "pow2", largest_batch=largest, gathered_embedding=gathered_embedding
    )
    graphs.captured = []

    def capture_one(b, ctx):
        if warm:
            graphs._fill([], [], b)
            graphs._body(b, ctx)
        graphs.graphs[b, ctx] = EagerReplay(graphs, b, ctx)
        graphs.captured.append((b, ctx))

    graphs._capture_one = capture_one
    for c in graphs.contexts:
        for b in graphs.batches:
            capture_one(b, c)
    graphs.generation = engine.cache.generation
    engine.decode_runner = graphs
    return graphs


@pytest.fixture
def emulate_decode_graphs():
    return emulated_decode_graphs


@pytest.fixture
def steps_match_reference(sharp_weights):
    """check(engine, config, prompt, tokens): request 1, prefilled with `prompt`, decodes
    `tokens` a step each, every step's logits within 1e-4 of the reference's (the sharp
    weights)."""

    def check(engine, config: dict, prompt: torch.Tensor, tokens=(3, 4)) -> None:
        ref = ReferenceModel(config, sharp_weights, "cpu")
        history = prompt.tolist()
        for token in tokens:
            out = engine.decode([1], torch.tensor([token]))
            history.append(token)
            want = ref.forward(torch.tensor(history)[None])[0, -1].float()
            assert (out[0] - want).abs().max().item() < 1e-4

    return check
