"""`bash run.sh` on real checkpoints, on the CPU: SmolLM2-135M-Instruct as import-gguf writes it
(the folder left byte for byte as it was; the written engine's greedy text equals transformers'),
and `save_pretrained` checkpoints with GQA, tied and untied heads (logits to 1e-4)."""

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
import torch

from evaluator.engine_loader import load_engine_module

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at"]


def _digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def run_sh(folder: Path, tmp_path: Path, child_env, *extra) -> Path:
    """run.sh on the folder's config.json (its weights: the folder); the written engine."""
    ws = tmp_path / "ws"
    cmd = ["bash", "run.sh", "--model-config", str(folder / "config.json"), "--device", "cpu"]
    cmd += ["--workspace", str(ws), "--storage", f"sqlite:///{tmp_path}/study.db", *extra]
    proc = subprocess.run(
        cmd, cwd=REPO_ROOT, env=child_env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "noise gate:" in (ws / "results.log").read_text()
    return ws / "engine.py"


def greedy(step, prompt_ids: list, new: int) -> list:
    """`new` greedy tokens after the prompt; `step(ids)` gives the next-token logits."""
    ids, out = list(prompt_ids), []
    for _ in range(new):
        token = int(step(ids).argmax())
        out.append(token)
        ids.append(token)
    return out


def engine_greedy(engine, prompt_ids: list, new: int) -> list:
    """The same with the engine: one prefill, then a decode step per token."""
    out = []
    logits = engine.prefill([0], [torch.tensor(prompt_ids)])[0]
    for _ in range(new):
        out.append(int(logits.argmax()))
        logits = engine.decode([0], torch.tensor(out[-1:]))[0]
    engine.remove([0])
    return out


def test_run_sh_on_smollm2_reads_the_folder_and_writes_an_engine_that_writes_its_text(
    smollm2_dir, smollm2_hf, tmp_path, child_env
):
    from tokenizers import Tokenizer

    before = _digest(smollm2_dir)
    engine_file = run_sh(smollm2_dir, tmp_path, child_env, "--trials", "1", "--remeasure", "0")
    assert _digest(smollm2_dir) == before  # read, never written
    text = engine_file.read_text()  # one safetensors file: its reader alone
    assert "def read_safetensors_weights" in text and "def read_checkpoint" not in text
    assert "read as safetensors" in text
    config = json.loads((smollm2_dir / "config.json").read_text())
    engine = load_engine_module(engine_file).create_engine(config, str(smollm2_dir), "cpu")
    tokenizer = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))

    def theirs(ids):
        with torch.no_grad():
            return smollm2_hf(torch.tensor([ids])).logits[0, -1]

    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt).ids
        assert engine_greedy(engine, ids, 8) == greedy(theirs, ids, 8), prompt
    text = tokenizer.decode(engine_greedy(engine, tokenizer.encode(PROMPTS[0]).ids, 3))
    assert text.startswith(" Paris"), text


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_run_sh_on_a_save_pretrained_checkpoint_matches_transformers(tmp_path, child_env, tie):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=tie, rope_theta=10000.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    before = _digest(folder)
    engine_file = run_sh(folder, tmp_path, child_env, "--trials", "1", "--remeasure", "0")
    assert _digest(folder) == before
    ours = load_engine_module(engine_file).create_engine(
        json.loads((folder / "config.json").read_text()), str(folder), "cpu"
    )
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=gen) for n in (5, 17, 9)]
    got = ours.prefill([0, 1, 2], prompts)
    step = ours.decode([2, 0], torch.tensor([7, 11]))
    with torch.no_grad():
        want = [model(p[None]).logits[0, -1] for p in prompts]
        more = [
            torch.cat([prompts[2], torch.tensor([7])]),
            torch.cat([prompts[0], torch.tensor([11])]),
        ]
        want_step = [model(p[None]).logits[0, -1] for p in more]
    assert (got - torch.stack(want)).abs().max() < 1e-4
    assert (step - torch.stack(want_step)).abs().max() < 1e-4
