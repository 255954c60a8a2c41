"""load_weights: named errors for missing keys and wrong shapes, weights_only, fusion, casting,
and that nothing of the state dict is kept beyond the tensors the engine uses."""

import datetime
import gc
import weakref

import pytest
import torch

from evaluator.toy_weights import make_toy_weights
from variants.checkpoint.checks import expected_shapes
from variants.weights import LayerWeights, ModelWeights, load_weights


@pytest.fixture(scope="module")
def toy_state(tiny_config) -> dict:
    return make_toy_weights(tiny_config, seed=5)


def save(tmp_path, obj) -> str:
    torch.save(obj, tmp_path / "model.pt")
    return str(tmp_path)


def all_tensors(w: ModelWeights) -> list:
    found = [w.embed, w.norm, w.head]
    for layer in w.layers:
        found += [layer.input_norm, *layer.qkv, layer.o, layer.post_norm, *layer.gate_up]
        found.append(layer.down)
    return found


def test_expected_shapes_follow_the_contract(tiny_spec):
    shapes = expected_shapes(tiny_spec)
    assert len(shapes) == 3 + 9 * 2
    assert shapes["embed_tokens.weight"] == (256, 64)
    assert shapes["lm_head.weight"] == (256, 64)
    assert shapes["layers.1.self_attn.q_proj.weight"] == (4 * 24, 64)
    assert shapes["layers.1.self_attn.k_proj.weight"] == (2 * 24, 64)
    assert shapes["layers.0.self_attn.o_proj.weight"] == (64, 4 * 24)
    assert shapes["layers.0.mlp.down_proj.weight"] == (64, 96)
    assert shapes["layers.0.post_attention_layernorm.weight"] == (64,)


def test_missing_key_is_named_with_its_shape(tmp_path, tiny_spec, toy_state):
    state = {k: v for k, v in toy_state.items() if k != "layers.1.mlp.up_proj.weight"}
    with pytest.raises(KeyError, match=r"'layers.1.mlp.up_proj.weight' is missing.*\[96, 64\]"):
        load_weights(tiny_spec, save(tmp_path, state), "cpu", torch.float32, True, True)


def test_wrong_shape_is_named_with_the_expected_shape(tmp_path, tiny_spec, toy_state):
    state = dict(toy_state)
    state["layers.0.self_attn.k_proj.weight"] = torch.zeros(96, 64)
    with pytest.raises(
        ValueError,
        match=r"'layers.0.self_attn.k_proj.weight' has shape \[96, 64\], expected \[48, 64\]",
    ):
        load_weights(tiny_spec, save(tmp_path, state), "cpu", torch.float32, True, True)


def test_missing_file_is_named(tmp_path, tiny_spec):
    with pytest.raises(FileNotFoundError, match=r"no weights in .*model\.pt"):
        load_weights(tiny_spec, str(tmp_path), "cpu", torch.float32, True, True)


def test_non_dict_is_refused(tmp_path, tiny_spec, toy_state):
    with pytest.raises(ValueError, match="holds a list, expected a state dict"):
        load_weights(
            tiny_spec, save(tmp_path, list(toy_state.values())), "cpu", torch.float32, 1, 1
        )


def test_pickle_with_arbitrary_objects_is_refused(tmp_path, tiny_spec, toy_state):
    """weights_only=True: an object outside the tensor allow-list never gets unpickled."""
    state = {**toy_state, "created": datetime.datetime(2024, 1, 1)}
    with pytest.raises(ValueError, match="is not a plain tensor state dict"):
        load_weights(tiny_spec, save(tmp_path, state), "cpu", torch.float32, True, True)


def test_non_tensor_value_is_a_named_error(tmp_path, tiny_spec, toy_state):
    """A list is legal under weights_only, so the loader itself must refuse it by name."""
    state = {**toy_state, "norm.weight": [1.0] * 64}
    with pytest.raises(ValueError, match="'norm.weight' is a list, expected a tensor"):
        load_weights(tiny_spec, save(tmp_path, state), "cpu", torch.float32, True, True)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("layers.0.input_layernorm.weight", torch.ones(64, dtype=torch.long), "expected floating"),
        ("layers.0.self_attn.q_proj.bias", torch.zeros(96), "is a bias"),
        ("layers.2.mlp.up_proj.weight", torch.zeros(96, 64), "belongs to layer 2"),
    ],
)
def test_checkpoint_that_does_not_match_the_model(
    tmp_path, tiny_spec, toy_state, key, value, message
):
    state = {**toy_state, key: value}
    with pytest.raises(ValueError, match=message):
        load_weights(tiny_spec, save(tmp_path, state), "cpu", torch.float32, True, True)


@pytest.mark.parametrize("fuse_qkv", [True, False])
@pytest.mark.parametrize("fuse_gate_up", [True, False])
def test_fused_and_unfused_shapes_and_values(
    tmp_path, tiny_spec, toy_state, fuse_qkv, fuse_gate_up
):
    w = load_weights(
        tiny_spec, save(tmp_path, toy_state), "cpu", torch.float32, fuse_qkv, fuse_gate_up
    )
    assert len(w.layers) == 2 and all(isinstance(x, LayerWeights) for x in w.layers)
    for n, layer in enumerate(w.layers):
        p = f"layers.{n}."
        q, k, v = (toy_state[p + f"self_attn.{x}_proj.weight"] for x in "qkv")
        gate, up = toy_state[p + "mlp.gate_proj.weight"], toy_state[p + "mlp.up_proj.weight"]
        if fuse_qkv:
            assert [tuple(t.shape) for t in layer.qkv] == [(96 + 48 + 48, 64)]
            assert torch.equal(layer.qkv[0], torch.cat([q, k, v]))
        else:
            assert [tuple(t.shape) for t in layer.qkv] == [(96, 64), (48, 64), (48, 64)]
            assert all(torch.equal(a, b) for a, b in zip(layer.qkv, (q, k, v)))
        if fuse_gate_up:
            assert [tuple(t.shape) for t in layer.gate_up] == [(192, 64)]
            assert torch.equal(layer.gate_up[0], torch.cat([gate, up]))
        else:
            assert [tuple(t.shape) for t in layer.gate_up] == [(96, 64), (96, 64)]
            assert torch.equal(layer.gate_up[0], gate) and torch.equal(layer.gate_up[1], up)
        assert torch.equal(layer.o, toy_state[p + "self_attn.o_proj.weight"])
        assert torch.equal(layer.down, toy_state[p + "mlp.down_proj.weight"])
    assert torch.equal(w.embed, toy_state["embed_tokens.weight"])
    assert torch.equal(w.head, toy_state["lm_head.weight"])
    assert not torch.equal(w.embed, w.head)  # not tied
    assert all(t.is_contiguous() for t in all_tensors(w))


def test_cast_to_the_compute_dtype(tmp_path, tiny_spec, toy_state):
    w = load_weights(tiny_spec, save(tmp_path, toy_state), "cpu", torch.float16, True, False)
    tensors = all_tensors(w)
    assert {t.dtype for t in tensors} == {torch.float16}
    assert {t.device.type for t in tensors} == {"cpu"}
    assert torch.equal(w.embed, toy_state["embed_tokens.weight"].half())
    assert torch.equal(w.layers[1].gate_up[1], toy_state["layers.1.mlp.up_proj.weight"].half())


def test_extra_keys_are_ignored(tmp_path, tiny_spec, toy_state):
    state = {**toy_state, "rotary_emb.inv_freq": torch.ones(12)}
    w = load_weights(tiny_spec, save(tmp_path, state), "cpu", torch.float32, True, True)
    assert len(all_tensors(w)) == 3 + 2 * 6


@pytest.mark.parametrize("dtype, fuse", [(torch.float16, False), (torch.float32, True)])
def test_state_dict_tensors_are_not_kept(monkeypatch, tmp_path, tiny_spec, toy_state, dtype, fuse):
    """After loading, a tensor read from disk is alive only if it IS one of the ModelWeights
    tensors (a float32 CPU load needs no copy); casts and fused parts are freed."""
    directory = save(tmp_path, toy_state)
    refs, real_load = [], torch.load

    def spy(*args, **kwargs):
        state = real_load(*args, **kwargs)
        refs.extend(weakref.ref(t) for t in state.values())
        return state

    monkeypatch.setattr(torch, "load", spy)
    w = load_weights(tiny_spec, directory, "cpu", dtype, fuse, fuse)
    gc.collect()
    kept = {id(t) for t in all_tensors(w)}
    alive = [r() for r in refs if r() is not None]
    assert len(refs) == 21
    assert all(id(t) in kept for t in alive)
    if dtype == torch.float16:
        assert alive == []
    else:  # every unfused tensor is reused as is, every q/k/v/gate/up part is freed
        assert len(alive) == 21 - 2 * 5
    per_layer = 9 if not fuse else 6
    assert len(all_tensors(w)) == 3 + 2 * per_layer
    elements = sum(t.numel() for t in all_tensors(w))
    assert elements == sum(t.numel() for t in toy_state.values())
