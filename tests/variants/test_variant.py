"""Variant: a round trip through dicts and JSON, unknown fields refused, one name per assembly."""

import dataclasses
import json

import pytest

from variants.variant import Variant


def test_defaults_are_the_safe_assembly():
    v = Variant()
    assert (v.cache, v.attention, v.execution, v.graphs, v.dtype) == (
        "slab",
        "sdpa",
        "eager",
        "off",
        "config",
    )
    assert v.name == "slab/sdpa-auto/eager/fused-qkv+gateup/config"


def test_round_trip_through_dict_and_json(all_cpu_variants):
    prefix = Variant(cache="paged", prefix_cache=True)
    for v in [*all_cpu_variants, prefix]:
        d = v.to_dict()
        fields = {f.name for f in dataclasses.fields(Variant)}
        # prefix caching is named only when on: a searched variant's dict is what it was
        assert set(d) == (fields if v.prefix_cache else fields - {"prefix_cache"})
        assert Variant.from_dict(d) == v
        assert Variant.from_dict(json.loads(json.dumps(d))) == v


def test_unknown_field_is_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown variant field\(s\): \['blocksize'\]"):
        Variant.from_dict({"cache": "paged", "blocksize": 64})


def test_partial_dict_takes_defaults():
    assert Variant.from_dict({"cache": "paged", "block_size": 64}) == Variant(
        cache="paged", block_size=64
    )


def test_frozen_and_hashable():
    v = Variant()
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.cache = "paged"
    assert len({Variant(), Variant(), Variant(cache="paged")}) == 2


def test_names_are_unique_across_cpu_variants(all_cpu_variants):
    names = [v.name for v in all_cpu_variants]
    assert len(names) == len(set(names)) == len(all_cpu_variants)
    assert any(v.execution == "compile" for v in all_cpu_variants)


@pytest.mark.parametrize(
    "variant, name",
    [
        (Variant(cache="paged", block_size=64), "paged64/sdpa-auto/eager/fused-qkv+gateup/config"),
        (
            Variant(cache="contiguous", attention="manual", fuse_qkv=False),
            "contiguous/manual/eager/fused-gateup/config",
        ),
        (
            Variant(sdpa_backend="math", execution="compile", fuse_gate_up=False),
            "slab/sdpa-math/compile-default/fused-qkv/config",
        ),
        (
            Variant(graphs="pow2", dtype="bfloat16", fuse_qkv=False, fuse_gate_up=False),
            "slab/sdpa-auto/eager/graphs-pow2/unfused/bfloat16",
        ),
        (
            Variant(cache="paged", prefix_cache=True, attention="manual"),
            "paged16/prefix/manual/eager/fused-qkv+gateup/config",
        ),
    ],
)
def test_name_spells_every_applied_axis(variant, name):
    assert variant.name == name


def test_axes_that_do_not_apply_are_not_in_the_name():
    assert Variant(block_size=64).name == Variant().name
    assert Variant(attention="manual", sdpa_backend="flash").name == "slab/manual/eager/" + (
        "fused-qkv+gateup/config"
    )
