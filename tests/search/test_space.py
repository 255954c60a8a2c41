"""The search space: conditional axes, the probe's filter, and parameters Optuna can store."""

import dataclasses
import itertools

import optuna
import pytest

from search import setup as space_module
from search.setup import SearchSpace
from variants import registry
from variants.presets import PRESETS
from variants.probe import probe_capabilities
from variants.registry import AXES, Axis, Choice
from variants.variant import Variant

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def cpu_caps(tiny_config):
    return probe_capabilities("cpu", tiny_config)


@pytest.fixture(scope="module")
def cuda_caps(cpu_caps):
    """What an sm_90 GPU with triton would offer (no GPU is needed to build the space)."""
    return dataclasses.replace(
        cpu_caps,
        device="cuda:0",
        device_type="cuda",
        gpu_name="NVIDIA H200",
        compute_capability=(9, 0),
        triton_version=(3, 3),
        sdpa_backends=("auto", "math", "efficient", "flash", "cudnn"),
        has_flex=True,
        can_compile=True,
    )


def all_variants(caps) -> set:
    """Brute force: every combination of registry values the probe accepts, canonicalised."""
    space = SearchSpace(caps)
    found = set()
    for values in itertools.product(*(axis.values for axis in AXES)):
        variant = Variant.from_dict(dict(zip((a.name for a in AXES), values, strict=True)))
        if caps.why_invalid(variant) is None:
            found.add(space.canonical(variant))
    return found


def open_axes(space: SearchSpace, variant: Variant) -> list[str]:
    """Parameter names expected for `variant`: axes that apply and offer more than one choice."""
    caps, values, partial, names = space.caps, variant.to_dict(), {}, []
    for axis in AXES:
        if not axis.applies(partial):
            continue
        choices = caps.choices(axis.name, partial)
        if len(choices) > 1:
            names.append(space.param_name(axis.name, choices))
        partial[axis.name] = values[axis.name]
    return names


def sample(space: SearchSpace, n: int, sampler) -> list[tuple[Variant, dict]]:
    study = optuna.create_study(sampler=sampler)
    out = []
    for _ in range(n):
        trial = study.ask()
        variant = space.suggest(trial)
        out.append((variant, dict(trial.params)))
        study.tell(trial, 0.0)
    return out


@pytest.mark.parametrize("caps_name", ["cpu_caps", "cuda_caps"])
def test_every_sampled_variant_is_valid_and_conditional(caps_name, request):
    caps = request.getfixturevalue(caps_name)
    space = SearchSpace(caps)
    drawn = sample(space, 300, optuna.samplers.RandomSampler(seed=0))
    for variant, params in drawn:
        assert caps.why_invalid(variant) is None, variant
        assert ("block_size" in params) == (variant.cache == "paged")
        backend_params = [k for k in params if k.startswith("sdpa_backend")]
        assert bool(backend_params) == (variant.attention == "sdpa")
        assert sorted(params) == sorted(open_axes(space, variant)), params
        assert space.canonical(variant) == variant
    # The random sampler reaches a good part of the space.
    assert len({v for v, _ in drawn}) > 0.5 * min(space.size, 300) * 0.5


def test_space_size_and_offered_choices_match_brute_force(cpu_caps, cuda_caps):
    for caps in (cpu_caps, cuda_caps):
        space = SearchSpace(caps)
        assert space.size == len(all_variants(caps))
    cpu = dict(SearchSpace(cpu_caps).describe())
    assert cpu["dtype"] == ("config",)  # the CPU reference computes in float32
    assert "flash" not in cpu.get("sdpa_backend", ())
    cuda = dict(SearchSpace(cuda_caps).describe())
    assert "flash" in cuda["sdpa_backend"]
    assert SearchSpace(cuda_caps).size > SearchSpace(cpu_caps).size


def test_narrowed_axes_get_their_own_parameter_name(cuda_caps):
    """float32 compute drops flash/cudnn: the narrower list must not reuse the axis name (Optuna
    rejects one name with two choice lists)."""
    space = SearchSpace(cuda_caps)
    drawn = sample(space, 300, optuna.samplers.RandomSampler(seed=1))
    names = {k for _, params in drawn for k in params if k.startswith("sdpa_backend")}
    assert "sdpa_backend" in names
    assert "sdpa_backend[auto|efficient|math]" in names
    for variant, _ in drawn:
        if variant.attention == "sdpa" and variant.dtype == "float32":
            assert variant.sdpa_backend not in ("flash", "cudnn")


def test_tpe_with_constraints_samples_valid_variants(cuda_caps):
    from search.study import make_sampler

    space = SearchSpace(cuda_caps)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=make_sampler(seed=0))
    for i in range(20):
        trial = study.ask()
        variant = space.suggest(trial)
        assert cuda_caps.why_invalid(variant) is None
        trial.set_user_attr("constraint", [0.0 if i % 3 else 1.0])
        if hasattr(trial, "set_constraint"):
            trial.set_constraint("correctness", 0.0 if i % 3 else 1.0)
        study.tell(trial, [float(i), 1.0])


@pytest.mark.parametrize("caps_name", ["cpu_caps", "cuda_caps"])
def test_enqueued_presets_come_back_as_themselves(caps_name, request):
    caps = request.getfixturevalue(caps_name)
    space = SearchSpace(caps)
    study = optuna.create_study()
    presets = [space.canonical(v) for v in PRESETS.values() if caps.why_invalid(v) is None]
    for variant in presets:
        study.enqueue_trial(space.params_for(variant))
    for variant in presets:
        trial = study.ask()
        assert space.suggest(trial) == variant
        study.tell(trial, 0.0)


def test_params_for_refuses_a_variant_the_probe_rejects(cpu_caps):
    with pytest.raises(ValueError, match="not offered"):
        SearchSpace(cpu_caps).params_for(Variant(attention="flex"))


def test_a_new_choice_joins_through_the_registry_alone(cpu_caps, monkeypatch):
    attention = registry.AXES_BY_NAME["attention"]
    extended = dataclasses.replace(attention, choices=attention.choices + (Choice("triton"),))
    axes = tuple(extended if a.name == "attention" else a for a in AXES)
    monkeypatch.setattr(registry, "AXES_BY_NAME", {a.name: a for a in axes})
    monkeypatch.setattr(registry, "AXES", axes)
    monkeypatch.setattr(space_module, "AXES", axes)
    space = SearchSpace(cpu_caps)
    assert dict(space.describe())["attention"] == ("manual", "sdpa", "triton")
    drawn = {v.attention for v, _ in sample(space, 60, optuna.samplers.RandomSampler(seed=2))}
    assert "triton" in drawn


def test_an_axis_that_never_applies_is_not_offered(cpu_caps, monkeypatch):
    axes = AXES + (Axis("never", (Choice(1), Choice(2)), applies=lambda p: False),)
    monkeypatch.setattr(space_module, "AXES", axes)
    assert "never" not in dict(SearchSpace(cpu_caps).describe())
