"""The architectures of hf_config.py's table against transformers' own models, on the CPU: two
prompts of different lengths prefilled together, then decoded together step by step, fed the
true tokens (the rows' contexts differ, so every mask is ragged). Each model's own part is
checked to matter: the engine without it drifts off transformers."""

import json

import pytest
import torch

from variants import Variant, build_engine
from variants.probe import probe_capabilities

transformers = pytest.importorskip("transformers")

COMPUTED = ["llama", "llama-tied", "llama3-scaled", "mistral-window16", "qwen2", "qwen3"]
VARIANTS = [
    Variant(),
    Variant(cache="paged", block_size=16, attention="manual", fuse_qkv=False),
    Variant(cache="contiguous", attention="sdpa", fuse_gate_up=False),
]
# two prompts, one longer than Mistral's window of 16, then decode steps together: up to 60
# positions, almost four windows
LENGTHS, STEPS = [24, 5], 36


def tokens_of(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 64), generator=torch.Generator().manual_seed(3))


def transformers_logits(folder, tokens) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    with torch.no_grad():
        return model(tokens).logits.float()


def worst_difference(engine, tokens, theirs) -> float:
    """The largest difference from transformers' logits over the logits' scale: the prompts
    (LENGTHS) prefilled together, then both decode together."""
    out = engine.prefill([0, 1], [tokens[r, :n] for r, n in enumerate(LENGTHS)])
    worst = max((out[r] - theirs[r, n - 1]).abs().max().item() for r, n in enumerate(LENGTHS))
    for step in range(STEPS):
        at = [n + step for n in LENGTHS]
        out = engine.decode([0, 1], torch.stack([tokens[r, p] for r, p in enumerate(at)]))
        worst = max(worst, *((out[r] - theirs[r, p]).abs().max().item() for r, p in enumerate(at)))
    engine.remove([0, 1])
    return worst / theirs.abs().max().item()


@pytest.mark.parametrize("name", COMPUTED)
def test_every_cpu_assembly_matches_transformers_step_by_step(held_out, name):
    folder = held_out(name)
    config = json.loads((folder / "config.json").read_text())
    tokens = tokens_of(config["vocab_size"])
    theirs = transformers_logits(folder, tokens)
    for variant in VARIANTS:
        engine = build_engine(config, str(folder), "cpu", variant)
        assert worst_difference(engine, tokens, theirs) < 1e-5, (name, variant.name)


@pytest.mark.parametrize(
    "name, without",
    [
        ("llama3-scaled", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
        ("mistral-window16", {"sliding_window": None}),
        # the architecture that lacks the part, the weights the same (the part's tensors are then
        # refused as extra weights, so each is dropped from the checkpoint instead)
        ("qwen2", {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}),
        ("qwen3", {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}),
    ],
)
def test_without_its_own_part_the_engine_drifts_off(held_out, tmp_path, name, without):
    """The held-out checkpoints exercise each part: computed without it, the same weights give
    logits well outside the step-by-step bound above."""
    folder = held_out(name)
    config = json.loads((folder / "config.json").read_text())
    tokens = tokens_of(config["vocab_size"])
    theirs = transformers_logits(folder, tokens)
    weights = str(folder)
    if name.startswith("qwen"):  # a LLaMA checkpoint: the same tensors, the part's dropped
        from safetensors.torch import load_file, save_file

        state = load_file(folder / "model.safetensors")
        kept = {k: v for k, v in state.items() if not k.endswith((".bias", "q_norm.weight",
                                                                  "k_norm.weight"))}  # fmt: skip
        save_file(kept, tmp_path / "model.safetensors")
        weights = str(tmp_path)
    engine = build_engine({**config, **without}, weights, "cpu", Variant())
    assert worst_difference(engine, tokens, theirs) > 1e-3


@pytest.mark.parametrize(
    "name, refused",
    [
        ("qwen2", {"layers=fused": "the model has q/k/v biases, not computed by the fused"}),
        ("qwen3", {"layers=fused-pdl": "the model has q/k norms, not computed by the fused"}),
        ("mistral-window16", {
            "attention=triton": "a sliding window, not computed by our Triton attention",
            "attention=flex": "a sliding window, not computed by FlexAttention here",
        }),
    ],
)  # fmt: skip
def test_components_that_do_not_compute_a_part_are_not_offered(
    held_out, fake_cuda_caps, name, refused
):
    config = json.loads((held_out(name) / "config.json").read_text())
    caps = fake_cuda_caps(model_parts=probe_capabilities("cpu", config).model_parts)
    for choice, reason in refused.items():
        axis, value = choice.split("=")
        variant = Variant(cache="slab", attention="triton", layers="triton", graphs="pow2")
        variant = Variant(**{**variant.to_dict(), axis: value})
        assert reason in (caps.why_invalid(variant) or ""), (choice, caps.why_invalid(variant))
    # the torch and Triton layers compute every part
    assert caps.why_invalid(Variant(cache="slab", attention="sdpa", layers="triton")) is None


GPU_VARIANTS = [  # the GPU's assemblies that compute every part, with and without graphs
    Variant(cache="slab", attention="triton", layers="triton", graphs="pow2",
            prefill_graphs="pow2"),
    Variant(cache="paged", block_size=16, attention="sdpa", layers="triton", graphs="pow2"),
    Variant(cache="slab", attention="sdpa", layers="torch", execution="compile"),
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("name", COMPUTED)
def test_gpu_assemblies_stay_within_bfloat16_noise_of_transformers(held_out, name):
    """In bfloat16 on the GPU: every step's error against transformers' float32 logits within
    three times transformers' own bfloat16 error (and 1e-2 of the scale), where the registry
    offers the assembly for the model."""
    folder = held_out(name)
    config = {**json.loads((folder / "config.json").read_text()), "dtype": "bfloat16"}
    tokens = tokens_of(config["vocab_size"])
    exact = transformers_logits(folder, tokens)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.bfloat16, attn_implementation="sdpa"
    ).to("cuda").eval()  # fmt: skip
    with torch.no_grad():
        noise = (model(tokens.cuda()).logits.float().cpu() - exact).abs().max().item()
    bound = (3 * noise + 1e-2 * exact.abs().max().item()) / exact.abs().max().item()
    caps = probe_capabilities("cuda", config)
    ran = 0
    for variant in GPU_VARIANTS:
        if caps.why_invalid(variant) is not None:
            continue
        engine = build_engine(config, str(folder), "cuda", variant)
        worst = worst_difference(engine, tokens.cuda(), exact.cuda())
        assert worst < bound, (name, variant.name, worst, bound)
        ran += 1
    assert ran >= 2, name
