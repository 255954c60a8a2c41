"""The GGUF -> Hugging Face LLaMA rules on small inputs (no GGUF file needed): q/k row order,
tensor names, and the config read from the metadata (and refused where the engine differs)."""

import pytest
import torch

from models.gguf_llama import (
    expected_shape,
    hf_config,
    hf_tensor_name,
    hf_tensor_names,
    interleaved_to_rotate_half,
)
from variants.checkpoint.hf_llama import rope_layout_of, rotate_half_to_interleaved
from variants.spec import ModelSpec

SMOLLM2_META = {
    "general.architecture": "llama",
    "llama.block_count": 30,
    "llama.context_length": 8192,
    "llama.embedding_length": 576,
    "llama.feed_forward_length": 1536,
    "llama.attention.head_count": 9,
    "llama.attention.head_count_kv": 3,
    "llama.rope.freq_base": 100000.0,
    "llama.attention.layer_norm_rms_epsilon": 9.999999747378752e-06,  # float32 1e-5
    "llama.rope.dimension_count": 64,
    "tokenizer.ggml.bos_token_id": 1,
    "tokenizer.ggml.eos_token_id": 2,
}


def test_rows_of_a_head_go_back_to_rotate_half():
    """One head of 4 dims, GGUF pairs (0,1) (2,3) -> HF pairs (0,2) (1,3)."""
    w = torch.arange(4.0).repeat_interleave(3).view(4, 3)
    assert interleaved_to_rotate_half(w, 1, 4)[:, 0].tolist() == [0.0, 2.0, 1.0, 3.0]


def test_the_loader_undoes_it():
    w = torch.randn(3 * 64, 576)
    back = rotate_half_to_interleaved(interleaved_to_rotate_half(w, 3, 64), 3, 64)
    assert torch.equal(back, w)


def test_tensor_names():
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    assert hf_tensor_name("blk.12.attn_output.weight") == "model.layers.12.self_attn.o_proj.weight"
    assert hf_tensor_name("blk.0.ffn_norm.weight") == (
        "model.layers.0.post_attention_layernorm.weight"
    )
    for name in ("blk.0.attn_q.bias", "rope_freqs.weight", "blk.x.attn_q.weight"):
        with pytest.raises(ValueError, match=r"has no place in a LLaMA model"):
            hf_tensor_name(name)


def test_config_from_smollm2_metadata_reads_as_our_spec():
    config = hf_config(SMOLLM2_META, vocab_size=49152, tied=True, torch_dtype="bfloat16")
    assert config["rms_norm_eps"] == 1e-05 and config["rope_theta"] == 100000.0
    assert (config["head_dim"], config["num_key_value_heads"]) == (64, 3)
    assert config["bos_token_id"] == 1 and "pad_token_id" not in config
    spec = ModelSpec.from_config(config)
    assert (spec.num_layers, spec.hidden_size) == (30, 576)
    assert rope_layout_of(spec.config) == "rotate_half"
    assert spec.tie_word_embeddings and spec.config_dtype == torch.bfloat16
    names = hf_tensor_names(config)
    assert len(names) == 2 + 30 * 9 and "lm_head.weight" not in names
    assert expected_shape("model.layers.3.self_attn.k_proj.weight", config) == (192, 576)
    assert expected_shape("model.layers.3.input_layernorm.weight", config) == (576,)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"general.architecture": "qwen2"}, r"general.architecture is 'qwen2'; only 'llama'"),
        ({"llama.rope.scaling.type": "linear"}, r"rope scaling 'linear' is not supported"),
        ({"llama.rope.dimension_count": 32}, r"RoPE on 32 of 64 head dims is not supported"),
        ({"llama.block_count": None}, r"the GGUF metadata lacks llama.block_count"),
    ],
)
def test_models_the_engine_cannot_compute_are_refused(change, message):
    meta = {k: v for k, v in {**SMOLLM2_META, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        hf_config(meta, vocab_size=49152, tied=True, torch_dtype="bfloat16")
