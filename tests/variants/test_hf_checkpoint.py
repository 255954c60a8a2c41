"""Hugging Face LLaMA checkpoints run unchanged: `save_pretrained` output (single safetensors,
sharded with an index, tied head, a .bin) against transformers' own logits, and the loader's
refusals of everything else, each naming its cause."""

import ast
import datetime
import json
import sys
from pathlib import Path

import pytest
import torch

from evaluator.engine_loader import load_engine_module
from evaluator.toy_weights import save_toy_weights
from variants import Variant, build_engine
from variants.checkpoint.course_config import OPTIONAL_KEYS
from variants.checkpoint.formats import find_weight_file, read_safetensors_weights
from variants.checkpoint.hf_config import (
    COURSE_ARCHITECTURE,
    COURSE_KEYS,
    NotComputed,
    architecture_of,
)
from variants.checkpoint.hf_llama import rope_layout_of, rotate_half_to_interleaved
from variants.checkpoint.reader import course_state_dict
from variants.render import render_engine
from variants.spec import SIZE_KEYS, ModelSpec

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

# GQA and sizes that divide nothing evenly: hidden 72 = 6 heads x 12, 2 kv heads.
HF_SIZES = dict(
    vocab_size=300,
    hidden_size=72,
    intermediate_size=100,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=12,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    rope_theta=500.0,  # small theta: even the slow pairs turn within the trace
)
ATOL = RTOL = 1e-4


def random_llama(tie: bool, seed: int):
    """A LlamaForCausalLM with sharp attention (q/k std 0.2) and non-trivial norm weights."""
    config = transformers.LlamaConfig(
        **HF_SIZES, tie_word_embeddings=tie, attn_implementation="eager"
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif "q_proj" in name or "k_proj" in name:
                p.normal_(0.0, 0.2)
            elif "lm_head" in name or "embed_tokens" in name:
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.05)
    return model


def saved(model, folder: Path, **kwargs) -> tuple:
    model.save_pretrained(folder, **kwargs)
    return json.loads((folder / "config.json").read_text()), str(folder)


@pytest.fixture(scope="module")
def untied():
    return random_llama(tie=False, seed=3)


@pytest.fixture(scope="module")
def untied_dir(untied, tmp_path_factory):
    return saved(untied, tmp_path_factory.mktemp("hf_single"))


def hf_last_logits(model, history: list) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([history])).logits[0, -1].float()


def run_against_hf(engine, model, seed: int = 0) -> int:
    """A trace with inserts, re-prefill, removals and ragged decode; every row checked."""
    gen = torch.Generator().manual_seed(seed)
    vocab = HF_SIZES["vocab_size"]
    history: dict = {}

    def prompt(n):
        return torch.randint(0, vocab, (n,), generator=gen)

    def check(ids, out):
        assert out.shape == (len(ids), vocab) and out.dtype == torch.float32
        for row, rid in zip(out, ids):
            torch.testing.assert_close(
                row, hf_last_logits(model, history[rid]), atol=ATOL, rtol=RTOL
            )

    def prefill(ids, lengths):
        prompts = [prompt(n) for n in lengths]
        for rid, p in zip(ids, prompts):
            history[rid] = p.tolist()
        check(ids, engine.prefill(ids, prompts))

    def decode(ids):
        tokens = torch.randint(0, vocab, (len(ids),), generator=gen)
        for rid, t in zip(ids, tokens.tolist()):
            history[rid].append(t)
        check(ids, engine.decode(ids, tokens))

    def remove(ids):
        engine.remove(ids)
        for rid in ids:
            del history[rid]

    prefill([0, 1, 2], [7, 13, 1])
    decode([0, 1, 2])
    decode([2, 0])
    prefill([3], [19])
    remove([1])
    decode([3, 0, 2])
    prefill([0], [5])  # replaces request 0
    decode([0, 3])
    remove([2])
    for _ in range(3):
        decode([3, 0])
    remove([0, 3])
    return len(history)


VARIANTS = [
    Variant(cache="slab", attention="manual"),
    Variant(cache="slab", attention="sdpa"),
    Variant(cache="paged", block_size=16, attention="sdpa"),
    Variant(cache="paged", block_size=4, attention="manual", fuse_qkv=False, fuse_gate_up=False),
    Variant(cache="contiguous", attention="sdpa"),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_save_pretrained_single_file_matches_transformers(variant, untied, untied_dir):
    config, folder = untied_dir
    assert (Path(folder) / "model.safetensors").is_file()
    assert run_against_hf(build_engine(config, folder, "cpu", variant), untied) == 0


def test_sharded_safetensors_with_index(untied, tmp_path):
    config, folder = saved(untied, tmp_path, max_shard_size="40KB")
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "model.safetensors.index.json").is_file()
    engine = build_engine(config, folder, "cpu", Variant(cache="paged", attention="manual"))
    assert run_against_hf(engine, untied, seed=1) == 0


def test_tied_embeddings_checkpoint(tmp_path):
    model = random_llama(tie=True, seed=4)
    config, folder = saved(model, tmp_path)
    keys = safetensors_torch.load_file(tmp_path / "model.safetensors").keys()
    assert config["tie_word_embeddings"] and "lm_head.weight" not in keys
    engine = build_engine(config, folder, "cpu", Variant(cache="slab", attention="sdpa"))
    assert engine.model.weights.head is engine.model.weights.embed  # one tensor, not a copy
    assert run_against_hf(engine, model, seed=2) == 0


def test_pytorch_bin_state_dict(untied, untied_dir, tmp_path):
    """An HF-style `pytorch_model.bin` (prefixed keys, rotate-half) read with weights_only."""
    config, _ = untied_dir
    torch.save(untied.state_dict(), tmp_path / "pytorch_model.bin")
    engine = build_engine(config, str(tmp_path), "cpu", Variant(cache="contiguous"))
    assert run_against_hf(engine, untied, seed=3) == 0


def test_rendered_engine_loads_save_pretrained_output(untied, untied_dir, tmp_path):
    config, folder = untied_dir
    path = render_engine(Variant(cache="paged", attention="sdpa"), tmp_path / "engine.py")
    top_imports = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            top_imports |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            top_imports.add((node.module or "").split(".")[0])
    assert "safetensors" not in top_imports and "variants" not in top_imports
    engine = load_engine_module(path).create_engine(config, folder, "cpu")
    assert run_against_hf(engine, untied, seed=4) == 0


def test_an_engine_for_one_safetensors_file_reads_it_and_carries_no_other_format(
    untied, untied_dir, tmp_path
):
    """Rendered for a target whose weights are one safetensors file (SmolLM2's folder): the
    same logits as transformers, a tied head and a file of another name read, and none of the
    other formats' readers carried; weights in another format are one line naming the cure."""
    config, folder = untied_dir
    variant = Variant(cache="slab", attention="sdpa")
    path = render_engine(variant, tmp_path / "lean" / "engine.py", weights="safetensors")
    text, general = path.read_text(), render_engine(variant, tmp_path / "engine.py").read_text()
    for name in ("def read_checkpoint", "def read_sharded_weights", "def read_pickled_weights"):
        assert name not in text and name in general
    assert "def rope_theta_of" in text and "def convert_rotate_half_qk" in text
    module = load_engine_module(path)
    assert run_against_hf(module.create_engine(config, folder, "cpu"), untied, seed=5) == 0

    tied = random_llama(tie=True, seed=6)
    tied_config, _ = saved(tied, tmp_path / "tied")
    (tmp_path / "tied" / "model.safetensors").rename(tmp_path / "tied" / "weights.safetensors")
    engine = module.create_engine(tied_config, str(tmp_path / "tied"), "cpu")
    assert run_against_hf(engine, tied, seed=6) == 0

    (tmp_path / "bin").mkdir()
    torch.save(untied.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="reads one safetensors file, the format it was"):
        module.create_engine(config, str(tmp_path / "bin"), "cpu")


def test_config_without_llama_name_skips_the_conversion_and_misses(untied, untied_dir):
    """The conversion is what makes HF weights match: a config claiming the course's
    interleaved `tiny_llama` loads the same file unconverted, and the logits are far off."""
    config, folder = untied_dir
    course_like = {**config, "model_type": "tiny_llama", "architectures": ["TinyLlamaForCausalLM"]}
    engine = build_engine(course_like, folder, "cpu", Variant())
    ids = torch.arange(20) % HF_SIZES["vocab_size"]
    out = engine.prefill([0], [ids])[0]
    assert (out - hf_last_logits(untied, ids.tolist())).abs().max() > 100 * ATOL


# ------------------------------------------------------------------ the q/k row permutation
def hf_permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """transformers' convert_llama_weights_to_hf.py: Meta's interleaved rows -> rotate-half."""
    rows, cols = w.shape
    return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def test_permutation_inverts_hf_conversion():
    w = torch.randn(3 * 8, 5)
    assert torch.equal(rotate_half_to_interleaved(hf_permute(w, 3), 3, 8), w)
    assert torch.equal(hf_permute(rotate_half_to_interleaved(w, 3, 8), 3), w)


def test_permuted_rows_make_interleaved_rope_equal_rotate_half():
    """Rotate-half RoPE of HF's rows == our interleaved RoPE of the converted rows, per head."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from variants.layers.rope import RopeTable, apply_rope

    heads, d, hidden, t = 3, 12, 10, 9
    w_hf, x = torch.randn(heads * d, hidden), torch.randn(t, hidden)
    table = RopeTable(d, 32, 500.0, "cpu", torch.float32)
    cos, sin = table.at(torch.arange(t))
    ours = apply_rope(
        (x @ rotate_half_to_interleaved(w_hf, heads, d).T).view(t, heads, d), cos, sin
    )
    hf = (x @ w_hf.T).view(t, heads, d).transpose(0, 1)[None]  # [1, heads, t, d]
    full_cos, full_sin = torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None]
    hf_rot, _ = apply_rotary_pos_emb(hf, hf, full_cos, full_sin)
    back = rotate_half_to_interleaved(hf_rot[0].transpose(0, 1).reshape(t, heads * d).T, heads, d)
    torch.testing.assert_close(ours.reshape(t, heads * d), back.T, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ config keys
OLD_OR_NEW_KEYS = ("dtype", "torch_dtype", "rope_parameters", "rope_theta")


def in_transformers_5_keys(config: dict) -> dict:
    """`config` as transformers 5 writes it (`dtype`, `rope_parameters`), whichever wrote it."""
    kept = {k: v for k, v in config.items() if k not in OLD_OR_NEW_KEYS}
    rope = {"rope_type": "default", "rope_theta": 500.0}
    return {**kept, "dtype": "float32", "rope_parameters": rope}


def test_hf_config_keys_are_read(untied_dir):
    config = in_transformers_5_keys(untied_dir[0])
    spec = ModelSpec.from_config(config)
    assert spec.config_dtype == torch.float32 and spec.rope_theta == 500.0
    assert rope_layout_of(spec.config) == "rotate_half"
    legacy = {**config, "torch_dtype": "bfloat16", "rope_theta": 500.0}
    del legacy["dtype"], legacy["rope_parameters"]
    assert ModelSpec.from_config(legacy).config_dtype == torch.bfloat16
    assert rope_layout_of({**legacy, "architectures": None}) == "rotate_half"
    course = {**legacy, "model_type": "tiny_llama", "architectures": ["TinyLlamaForCausalLM"]}
    assert rope_layout_of(ModelSpec.from_config(course).config) == "interleaved"


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500.0}},
            "'llama3' lacks factor",
        ),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0}}, "'yarn' is not computed"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "'linear'"),
        ({"rope_theta": 10000.0}, "disagree"),
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"dtype": "float64"}, "unsupported torch_dtype"),
        ({"architectures": ["GemmaForCausalLM"]}, "'GemmaForCausalLM' is not an architecture"),
        ({"model_type": "phi3"}, "model_type 'phi3' is not an architecture"),
        (
            {"model_type": "qwen2", "architectures": None, "use_sliding_window": True},
            "use_sliding_window is true",
        ),
        ({"model_type": "tiny_llama"}, "name different models"),
        ({"use_qk_norm": True}, "LlamaForCausalLM has no q/k norms"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
    ],
)
def test_unsupported_config_is_refused_by_name(untied_dir, change, message):
    config = in_transformers_5_keys(untied_dir[0])
    with pytest.raises(ValueError, match=message):
        ModelSpec.from_config({**config, **change})


def test_the_architecture_table_names_what_the_engine_computes(untied_dir, tiny_config):
    config = in_transformers_5_keys(untied_dir[0])
    assert architecture_of(config).name == "LlamaForCausalLM"
    # a window as long as the positions served is no window; one turned off neither
    ModelSpec.from_config({**config, "sliding_window": config["max_position_embeddings"]})
    ModelSpec.from_config({**config, "sliding_window": 16, "use_sliding_window": False})
    # the course's config in its own keys is the course contract's model, whatever its name
    assert architecture_of(tiny_config) is COURSE_ARCHITECTURE
    assert architecture_of({**tiny_config, "model_type": "course_llama"}) is COURSE_ARCHITECTURE
    assert architecture_of({**tiny_config, "model_type": "llama"}).rope_layout == "rotate_half"
    with pytest.raises(NotComputed, match="supported: LlamaForCausalLM"):
        architecture_of({**tiny_config, "model_type": "gemma", "tie_word_embeddings": True})
    assert set(COURSE_KEYS) == set(SIZE_KEYS.values()) | set(OPTIONAL_KEYS)


# ------------------------------------------------------------------ course format and refusals
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    config = json.loads((Path(__file__).parents[1] / "data" / "tiny_config.json").read_text())
    folder = tmp_path_factory.mktemp("tiny_course")
    save_toy_weights(config, folder / "model.pt", seed=5, qk_scale=8.0)
    return config, folder, torch.load(folder / "model.pt", weights_only=True)


def test_course_model_pt_is_never_converted(tiny):
    """The course contract fixes model.pt as interleaved, even if the config says llama."""
    config, folder, state = tiny
    spec = ModelSpec.from_config({**config, "model_type": "llama"})
    assert rope_layout_of(spec.config) == "rotate_half"
    loaded = course_state_dict(spec, str(folder))
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_course_state_in_safetensors_with_prefix(tiny, tmp_path):
    config, _, state = tiny
    prefixed = {k if k == "lm_head.weight" else "model." + k: v for k, v in state.items()}
    safetensors_torch.save_file(prefixed, tmp_path / "model.safetensors")
    loaded = course_state_dict(ModelSpec.from_config(config), str(tmp_path))
    assert sorted(loaded) == sorted(state)
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_missing_lm_head_falls_back_to_the_embedding(tiny, tmp_path):
    config, _, state = tiny
    torch.save({k: v for k, v in state.items() if k != "lm_head.weight"}, tmp_path / "model.pt")
    loaded = course_state_dict(ModelSpec.from_config(config), str(tmp_path))
    assert loaded["lm_head.weight"] is loaded["embed_tokens.weight"]


def test_weight_file_choice(tmp_path):
    for name in ("pytorch_model.bin", "model.safetensors", "model.pt"):
        (tmp_path / name).write_bytes(b"")
        assert find_weight_file(tmp_path) == str(tmp_path / name)  # later names win here
    assert find_weight_file(tmp_path / "pytorch_model.bin") == str(tmp_path / "pytorch_model.bin")
    only = tmp_path / "only"
    only.mkdir()
    (only / "weights.pth").write_bytes(b"")
    (only / "README.md").write_text("")
    assert find_weight_file(only) == str(only / "weights.pth")


def refusal(config, folder, exc_type, message):
    with pytest.raises(exc_type, match=message):
        course_state_dict(ModelSpec.from_config(config), str(folder))


def test_refusals_name_the_cause(tiny, tmp_path):
    config, _, state = tiny
    refusal(config, tmp_path / "absent", FileNotFoundError, "does not exist")
    (tmp_path / "notes.txt").write_text("hello")
    refusal(config, tmp_path, FileNotFoundError, r"expected one of model\.pt.*found notes\.txt")
    (tmp_path / "a.safetensors").write_bytes(b"")
    (tmp_path / "b.bin").write_bytes(b"")
    refusal(config, tmp_path, ValueError, "several candidates")


@pytest.mark.parametrize(
    "content, exc_type, message",
    [
        ({"w": datetime.datetime(2020, 1, 1)}, ValueError, r"weights_only=True\) refused"),
        ([torch.zeros(2)], ValueError, "holds a list, expected a state dict"),
        ({"embed_tokens.weight": 3}, ValueError, "'embed_tokens.weight' is a int"),
    ],
)
def test_bad_pickles_are_refused(tiny, tmp_path, content, exc_type, message):
    config = tiny[0]
    torch.save(content, tmp_path / "model.pt")
    refusal(config, tmp_path, exc_type, message)


def test_text_named_like_weights_is_refused(tiny, tmp_path):
    (tmp_path / "model.safetensors").write_text("not a tensor file")
    refusal(tiny[0], tmp_path, ValueError, "not a readable safetensors file")
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_text("not a pickle")
    refusal(tiny[0], tmp_path, ValueError, "weights_only")


@pytest.mark.parametrize(
    "drop, add, exc_type, message",
    [
        ("layers.1.mlp.up_proj.weight", {}, KeyError, r"'layers\.1\.mlp\.up_proj\.weight' is miss"),
        ("norm.weight", {"norm.weight": torch.ones(63)}, ValueError, r"shape \[63\], expected"),
        ("", {"norm.weight": torch.ones(64, dtype=torch.long)}, ValueError, "floating point"),
        ("", {"layers.0.self_attn.q_proj.bias": torch.zeros(96)}, ValueError, "is a bias"),
        ("", {"layers.2.mlp.up_proj.weight": torch.zeros(96, 64)}, ValueError, "layer 2"),
        ("", {"model.norm.weight": torch.ones(64)}, ValueError, "with and without"),
    ],
)
def test_state_dict_problems_are_named(tiny, tmp_path, drop, add, exc_type, message):
    config, _, state = tiny
    torch.save({**{k: v for k, v in state.items() if k != drop}, **add}, tmp_path / "model.pt")
    refusal(config, tmp_path, exc_type, message)


def test_missing_key_is_named_after_prefix_stripping(untied_dir, tmp_path):
    config, folder = untied_dir
    state = safetensors_torch.load_file(Path(folder) / "model.safetensors")
    del state["model.layers.1.self_attn.k_proj.weight"]
    safetensors_torch.save_file(state, tmp_path / "model.safetensors")
    refusal(config, tmp_path, KeyError, r"'layers\.1\.self_attn\.k_proj\.weight' is missing")


def test_broken_shard_index(untied, untied_dir, tmp_path):
    config, _ = untied_dir
    untied.save_pretrained(tmp_path, max_shard_size="40KB")
    index_path = tmp_path / "model.safetensors.index.json"
    weight_map = json.loads(index_path.read_text())["weight_map"]
    shards = sorted(set(weight_map.values()))
    key = next(k for k, s in weight_map.items() if s == shards[0])

    def refused_with(mapping, exc_type, message):
        index_path.write_text(json.dumps({"weight_map": mapping}))
        refusal(config, tmp_path, exc_type, message)

    refused_with({**weight_map, key: shards[1]}, ValueError, f"maps '{key}' to {shards[1]}, which")
    refused_with({**weight_map, key: "gone.safetensors"}, FileNotFoundError, "names shard gone")
    refused_with({**weight_map, key: "../x.safetensors"}, ValueError, "is not a file name")
    refused_with({}, ValueError, "has no weight_map")
    index_path.write_text("{")
    refusal(config, tmp_path, ValueError, "is not a weight index json")


def test_missing_safetensors_package_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ImportError, match="pip install safetensors"):
        read_safetensors_weights(str(tmp_path / "model.safetensors"))
