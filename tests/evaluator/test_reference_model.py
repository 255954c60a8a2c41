"""The reference model against transformers' LLaMA, and its own invariants."""

import json
import math

import pytest
import torch

from evaluator.hf_reference import TransformersReference
from evaluator.reference_model import (
    NoReference,
    ReferenceModel,
    apply_rope,
    check_judgeable,
    compute_dtype_for,
    exact_float32,
    load_reference,
    rms_norm,
    rope_cos_sin,
)
from evaluator.toy_weights import save_toy_weights

transformers = pytest.importorskip("transformers")

MHA_CONFIG = {
    "model_type": "tiny_llama",
    "torch_dtype": "float16",
    "vocab_size": 200,
    "hidden_size": 48,
    "intermediate_size": 80,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,  # != 48 / 4, like the course model
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 500.0,  # a small theta turns even the slow pairs within 40 positions
}


def interleaved_to_rotate_half(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Reorder q/k rows per head so HF's rotate-half pairs (j, j+d/2) are our pairs (2j, 2j+1)."""
    perm = torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))
    return w.view(-1, head_dim, w.shape[-1])[:, perm].reshape(w.shape)


def hf_llama(config: dict, weights: dict, permute: bool = True):
    hf_config = transformers.LlamaConfig(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"],
        max_position_embeddings=config["max_position_embeddings"],
        rms_norm_eps=config["rms_norm_eps"],
        rope_theta=config["rope_theta"],
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="eager",
        torch_dtype=torch.float32,
    )
    model = transformers.LlamaForCausalLM(hf_config).float().eval()
    state = {}
    for name, tensor in weights.items():
        if permute and name.endswith(("q_proj.weight", "k_proj.weight")):
            tensor = interleaved_to_rotate_half(tensor, config["head_dim"])
        state[name if name == "lm_head.weight" else "model." + name] = tensor
    model.load_state_dict(state, strict=True)
    return model


@pytest.fixture(scope="module")
def mha_sharp(tmp_path_factory):
    d = tmp_path_factory.mktemp("mha_sharp")
    save_toy_weights(MHA_CONFIG, d / "model.pt", seed=5, qk_scale=8.0, head_scale=10.0)
    return str(d)


def random_ids(vocab: int, batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("which", ["gqa", "mha"])
def test_matches_transformers_llama(which, tiny_config, sharp_weights, mha_sharp):
    config, weight_dir = (tiny_config, sharp_weights) if which == "gqa" else (MHA_CONFIG, mha_sharp)
    ref = ReferenceModel(config, weight_dir)
    weights = torch.load(f"{weight_dir}/model.pt", weights_only=True)
    ids = random_ids(config["vocab_size"], 2, 40, seed=1)
    ours = ref.forward(ids)
    assert ours.shape == (2, 40, config["vocab_size"]) and ours.dtype == torch.float32
    with torch.no_grad():
        theirs = hf_llama(config, weights).forward(ids).logits
        unpermuted = hf_llama(config, weights, permute=False).forward(ids).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    # The check has teeth: with HF's convention applied to our rows the logits move a lot.
    assert (ours - unpermuted).abs().max().item() > 1e-1
    # Logits are not flat, so agreement to 1e-4 means something.
    assert ours.std().item() > 0.5


def test_a_hugging_face_folder_is_judged_by_transformers(tmp_path, tiny_config, sharp_weights):
    # save_pretrained writes model.safetensors with `model.` keys and rotate-half q/k rows: the
    # judge of that folder is transformers' own LlamaForCausalLM, and it computes the logits the
    # course's math computes from the course's model.pt of the same model.
    weights = torch.load(f"{sharp_weights}/model.pt", weights_only=True)
    hf_llama(tiny_config, weights).save_pretrained(tmp_path)
    hf_config = json.loads((tmp_path / "config.json").read_text())
    assert check_judgeable(hf_config, tmp_path) == "transformers' own LlamaForCausalLM"
    assert check_judgeable(tiny_config, sharp_weights).startswith("the course's reference")
    ids = random_ids(tiny_config["vocab_size"], 1, 30, seed=6)
    ours = ReferenceModel(tiny_config, sharp_weights).forward(ids)
    judge = load_reference(hf_config, tmp_path, dtype=torch.float64)
    assert isinstance(judge, TransformersReference)
    from_hf = judge.forward(ids)
    assert from_hf.dtype == torch.float64 and from_hf.shape == ours.shape
    assert (ours - from_hf).abs().max().item() < 1e-4 and ours.std().item() > 0.5
    some = judge.forward(ids, positions=torch.tensor([2, 29]))
    assert torch.allclose(some[0], from_hf[0, [2, 29]], rtol=0, atol=1e-12)


def test_a_folder_nothing_can_judge_is_one_line(tmp_path, tiny_config, sharp_weights):
    weights = torch.load(f"{sharp_weights}/model.pt", weights_only=True)
    hf_llama(tiny_config, weights).save_pretrained(tmp_path)
    hf_config = json.loads((tmp_path / "config.json").read_text())
    with pytest.raises(NoReference, match="knows no model_type 'no_such_model'"):
        check_judgeable({**hf_config, "model_type": "no_such_model"}, tmp_path)
    # the course's config over a Hugging Face folder: transformers knows no tiny_llama
    with pytest.raises(NoReference, match="model_type 'tiny_llama'"):
        check_judgeable(tiny_config, tmp_path)
    (tmp_path / "bad").mkdir()
    torch.save({"embed_tokens.weight": torch.zeros(3)}, tmp_path / "bad" / "model.pt")
    with pytest.raises(NoReference, match=r"embed_tokens.weight is \[3\], the contract says"):
        ReferenceModel(tiny_config, tmp_path / "bad")
    # a Hugging Face state dict saved as model.pt: the course's format by its name, refused by
    # the pre-flight's question, not by every trial
    prefixed = {f"model.{k}": v for k, v in weights.items()}
    torch.save(prefixed, tmp_path / "bad" / "model.pt")
    with pytest.raises(NoReference, match="embed_tokens.weight is missing, the contract says"):
        check_judgeable(tiny_config, tmp_path / "bad")


def test_without_transformers_a_hugging_face_folder_is_refused_in_one_line(
    tmp_path, tiny_config, sharp_weights
):
    """Offline and without transformers, run's pre-flight says so and exits 2: never a reference
    that shares the engine's reader."""
    import subprocess
    import sys
    from pathlib import Path

    weights = torch.load(f"{sharp_weights}/model.pt", weights_only=True)
    hf_llama(tiny_config, weights).save_pretrained(tmp_path / "hf")
    (tmp_path / "fake" / "transformers").mkdir(parents=True)
    (tmp_path / "fake" / "transformers" / "__init__.py").write_text("raise ImportError('none')")
    repo = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "search", "run", "--device", "cpu", "--workspace"]
    cmd += [str(tmp_path / "ws"), "--model-config", str(tmp_path / "hf" / "config.json")]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path / 'fake'}:{repo}"}
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "transformers is not installed: pip install transformers" in lines[0]
    assert not (tmp_path / "ws").exists()


def test_dtype_override_and_positions(tiny_config, sharp_weights):
    ids = random_ids(tiny_config["vocab_size"], 1, 20, seed=7)
    f32 = ReferenceModel(tiny_config, sharp_weights).forward(ids)
    for dtype, worst in ((torch.float64, 1e-4), (torch.bfloat16, 0.5), (torch.float16, 0.05)):
        ref = ReferenceModel(tiny_config, sharp_weights, "cpu", dtype=dtype)
        assert ref.compute_dtype == dtype and ref.w["norm.weight"].dtype == dtype
        out = ref.forward(ids)
        assert out.dtype == dtype
        err = (out.double() - f32.double()).abs().max().item()
        assert 0 < err < worst, (dtype, err)
    # Only the asked positions go through the head; the values are those of the full forward.
    ref = ReferenceModel(tiny_config, sharp_weights, dtype=torch.float64)
    some = ref.forward(ids, positions=torch.tensor([3, 19]))
    assert some.shape == (1, 2, tiny_config["vocab_size"])
    assert torch.allclose(some[0], ref.forward(ids)[0, [3, 19]], rtol=0, atol=1e-12)


def test_exact_float32_turns_tf32_off_on_cuda_only():
    saved = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")  # TF32 allowed, as an engine may set it
        with exact_float32(torch.device("cuda")):
            assert torch.get_float32_matmul_precision() == "highest"
        assert torch.get_float32_matmul_precision() == "high"
        with exact_float32(torch.device("cpu")):
            assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(saved)


def test_causal_appending_tokens_keeps_earlier_logits(tiny_config, sharp_weights):
    ref = ReferenceModel(tiny_config, sharp_weights)
    ids = random_ids(tiny_config["vocab_size"], 1, 40, seed=2)
    full = ref.forward(ids)
    prefix = ref.forward(ids[:, :25])
    assert (full[:, :25] - prefix).abs().max().item() < 1e-5
    # Changing a later token changes later logits only.
    edited = ids.clone()
    edited[0, 30] = (edited[0, 30] + 1) % tiny_config["vocab_size"]
    out = ref.forward(edited)
    assert (out[:, :30] - full[:, :30]).abs().max().item() < 1e-5
    assert (out[:, 30:] - full[:, 30:]).abs().max().item() > 1e-2


def test_batch_rows_are_independent(tiny_config, sharp_weights):
    ref = ReferenceModel(tiny_config, sharp_weights)
    ids = random_ids(tiny_config["vocab_size"], 3, 20, seed=3)
    batched = ref.forward(ids)
    for row in range(3):
        alone = ref.forward(ids[row : row + 1])
        assert (batched[row] - alone[0]).abs().max().item() < 1e-5


def test_compute_dtype_rule(tiny_config, tiny_weights):
    assert compute_dtype_for({"torch_dtype": "float16"}, "cuda") == torch.float16
    assert compute_dtype_for({}, "cuda:0") == torch.float16
    assert compute_dtype_for({"torch_dtype": "bfloat16"}, "cuda") == torch.bfloat16
    assert compute_dtype_for({"torch_dtype": "bf16"}, torch.device("cuda", 1)) == torch.bfloat16
    assert compute_dtype_for({"torch_dtype": "bfloat16"}, "cpu") == torch.float32
    assert compute_dtype_for({"torch_dtype": "float16"}, "cpu") == torch.float32

    ref = ReferenceModel({**tiny_config, "torch_dtype": "bf16"}, tiny_weights)
    assert ref.compute_dtype == torch.float32 and ref.device == torch.device("cpu")
    assert all(w.dtype == torch.float32 for w in ref.w.values())
    assert ref.forward(random_ids(256, 1, 4, seed=4)).dtype == torch.float32


def test_rope_rotates_interleaved_pairs_by_hand():
    # d = 4, theta = 100: inv_freq = [1, 1/10]; position p turns pair j by p * inv_freq[j].
    cos, sin = rope_cos_sin(3, 4, 100.0, torch.float32, torch.device("cpu"))
    x = torch.tensor([1.0, 0.0, 0.0, 2.0]).expand(3, 4)  # [T=3, d=4], same vector each position
    out = apply_rope(x, cos, sin)
    assert torch.equal(out[0], x[0])  # position 0 is the identity
    a, b = 2.0, 0.2  # angles of pairs (0, 1) and (2, 3) at position 2
    expected = torch.tensor([math.cos(a), math.sin(a), -2 * math.sin(b), 2 * math.cos(b)])
    assert torch.allclose(out[2], expected, atol=1e-6)


def test_rms_norm_normalises_then_scales():
    x = torch.tensor([[3.0, 4.0]])
    w = torch.tensor([2.0, 0.5])
    rms = math.sqrt((9 + 16) / 2 + 1e-5)
    expected = torch.tensor([[3 / rms * 2.0, 4 / rms * 0.5]])
    assert torch.allclose(rms_norm(x, w, 1e-5), expected, atol=1e-6)
    # Half precision input: normalised in float32, cast to half, multiplied in half.
    xh, wh = x.half() * 100, w.half()
    normed = (xh.float() * torch.rsqrt(xh.float().pow(2).mean(-1, keepdim=True) + 1e-5)).half()
    out = rms_norm(xh, wh, 1e-5)
    assert out.dtype == torch.float16 and torch.equal(out, normed * wh)
