"""`generate`: SmolLM2's greedy tokens from our engine equal transformers' (prompts decoded
together, one ending at EOS); the command prints them with tokens/s; bad input gets one line."""

import json
import re

import pytest
import torch

from search.cli import main
from serving.chat_template import render_chat
from serving.generate import generate_tokens
from variants.serving.sampling import greedy_tokens

PROMPTS = ["The capital of France is", "Once upon a time"]
CHAT = "What is the capital of France? One word."
SPEED = re.compile(
    r"^prefill (\d+) tokens in [\d.]+ ms \([\d,]+ tokens/s\); decode (\d+) tokens in [\d.]+ ms "
    r"\([\d,]+ tokens/s\) on cpu$"
)


class ScriptedEngine:
    """Each request's next tokens in order, as one-hot logits over 4 ids; records the calls."""

    def __init__(self, scripts: dict):
        self.scripts, self.calls = {r: list(s) for r, s in scripts.items()}, []

    def _logits(self, ids):
        return torch.eye(4)[[self.scripts[r].pop(0) for r in ids]]

    def prefill(self, ids, prompts):
        self.calls.append(("prefill", list(ids), [p.tolist() for p in prompts]))
        return self._logits(ids)

    def decode(self, ids, tokens):
        self.calls.append(("decode", list(ids), tokens.tolist()))
        return self._logits(ids)

    def remove(self, ids):
        self.calls.append(("remove", list(ids)))


def test_requests_leave_at_eos_at_their_limit_and_at_the_context_end():
    engine = ScriptedEngine({0: [3], 1: [1, 2, 3], 2: [1, 1, 1, 1], 3: [2, 2]})
    prompts = [[0], [0], [0], [0, 0, 0]]
    out = generate_tokens(engine, prompts, greedy_tokens, 4, {3}, 5, "cpu")
    assert out.tokens == [[3], [1, 2, 3], [1, 1, 1, 1], [2, 2]]
    assert out.finished_by_eos == [True, True, False, False]
    assert engine.calls == [
        ("prefill", [0, 1, 2, 3], [[0], [0], [0], [0, 0, 0]]),
        ("remove", [0]),
        ("decode", [1, 2, 3], [1, 1, 2]),
        ("remove", [3]),  # 3 prompt + 2 new tokens fill the 5-token context
        ("decode", [1, 2], [2, 1]),
        ("remove", [1]),
        ("decode", [2], [1]),
        ("remove", [2]),
    ]
    assert (out.prompt_tokens, out.decode_tokens) == (6, 6)


def test_greedy_tokens_equal_transformers(smollm2_short_dir, smollm2_hf, smollm2_engine):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(smollm2_short_dir / "tokenizer.json"))
    chat = render_chat(smollm2_short_dir, CHAT)
    prompts = [tokenizer.encode(p).ids for p in PROMPTS]
    prompts.append(tokenizer.encode(chat, add_special_tokens=False).ids)
    with torch.no_grad():
        out = generate_tokens(smollm2_engine, prompts, greedy_tokens, 12, {2}, 512, "cpu")
        for tokens, prompt in zip(out.tokens, prompts):
            ids = torch.tensor([prompt])
            theirs = smollm2_hf.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=2)
            assert tokens == theirs[0, len(prompt) :].tolist()
    assert out.finished_by_eos == [False, False, True]
    assert tokenizer.decode(out.tokens[0]).startswith(" Paris.")
    assert tokenizer.decode(out.tokens[2]) == "The capital of France is Paris."
    with pytest.raises(KeyError):
        smollm2_engine.remove([2])  # every request was removed


def test_command_prints_each_continuation_and_the_speed(
    smollm2_short_dir, slab_engine_file, capsys
):
    args = ["generate", "--engine", str(slab_engine_file), "--model", str(smollm2_short_dir)]
    args += ["--device", "cpu", "--max-new-tokens", "4"]
    assert main(args + ["--prompt", PROMPTS[0], "--prompt", PROMPTS[1]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "--- prompt 0 (5 tokens, 4 new, ended by limit)"
    assert lines[1] == "The capital of France is Paris."
    assert lines[2] == ""  # the fourth token is "\n\n"
    assert lines[4] == "--- prompt 1 (4 tokens, 4 new, ended by limit)"
    assert SPEED.match(lines[-1]).groups() == ("9", "6")
    assert main(args + ["--chat", "--prompt", CHAT, "--max-new-tokens", "12"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        "--- prompt 0 (40 tokens, 8 new, ended by EOS)",
        CHAT,
        "The capital of France is Paris.",
    ]


@pytest.fixture(scope="module")
def tiny_dir(tiny_config, tiny_weights, tmp_path_factory):
    """The tiny test model as a folder with a 256-byte tokenizer (one id per byte, no merges)."""
    from pathlib import Path

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder = tmp_path_factory.mktemp("tiny_model")
    (folder / "config.json").write_text(json.dumps(tiny_config))
    (folder / "model.pt").symlink_to(Path(tiny_weights) / "model.pt")
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def test_sampling_is_replayed_by_its_seed(tiny_dir, slab_engine_file, capsys):
    args = ["generate", "--engine", str(slab_engine_file), "--model", str(tiny_dir)]
    args += ["--prompt", "héllo", "--prompt", "x", "--max-new-tokens", "6", "--device", "cpu"]
    args += ["--temperature", "0.8", "--top-k", "50", "--top-p", "0.95", "--seed", "3"]
    outputs = []
    for _ in range(2):
        assert main(args) == 0
        outputs.append(capsys.readouterr().out.splitlines())
    assert outputs[0][0] == "--- prompt 0 (6 tokens, 6 new, ended by limit)"
    assert SPEED.match(outputs[0][-1]).groups() == ("7", "10")
    assert outputs[0][:-1] == outputs[1][:-1]


@pytest.mark.parametrize(
    "change, message",
    [
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
        (["--temperature", "-1"], "--temperature must be a number >= 0, got -1.0"),
        (["--temperature", "nan"], "--temperature must be a number >= 0, got nan"),
        (["--seed", str(2**64)], "--seed must be a 64-bit integer, -2**63 to 2**63 - 1; got"),
        (["--prompt", "a" * 600], "prompt 0 has 600 tokens, and the model's context"),
        (["--top-k", "-2"], "--top-k must be >= 0, got -2"),
        (["--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
        (["--device", "tpu"], "--device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
        (["--model", "{missing}"], "--model {missing} is not a folder: give the model folder"),
        (["--engine", "{missing}"], "engine file not found: {missing}: pass the engine file "),
        (["--prompt", ""], "prompt '' has no tokens: give a non-empty --prompt"),
        (["--chat"], "{model}/tokenizer_config.json with a chat_template ("),
    ],
)
def test_bad_input_gets_one_line(change, message, tiny_dir, slab_engine_file, tmp_path, capsys):
    names = {"missing": str(tmp_path / "missing"), "model": str(tiny_dir)}
    args = ["generate", "--engine", str(slab_engine_file), "--model", str(tiny_dir)]
    args += ["--device", "cpu"] + [c.format(**names) for c in change]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert message.format(**names) in err


def test_missing_files_of_the_model_folder(tiny_dir, slab_engine_file, tmp_path, capsys):
    args = ["generate", "--engine", str(slab_engine_file), "--model", str(tmp_path)]
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"error: no config.json or model_config.json in {tmp_path}: copy the model's config there\n"
    )
    (tmp_path / "model_config.json").write_text((tiny_dir / "config.json").read_text())
    assert main(args) == 2
    assert capsys.readouterr().err.startswith(f"error: no tokenizer.json in {tmp_path}: copy")
    (tmp_path / "tokenizer.json").symlink_to(tiny_dir / "tokenizer.json")
    assert main(args + ["--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: no weights in {tmp_path}: expected one of")
    assert err.count("\n") == 1


def test_weights_that_do_not_fit_the_config_are_one_line(
    tiny_dir, slab_engine_file, tmp_path, capsys
):
    config = json.loads((tiny_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps(dict(config, intermediate_size=2 * config["intermediate_size"]))
    )
    for name in ("model.pt", "tokenizer.json"):
        (tmp_path / name).symlink_to(tiny_dir / name)
    args = ["generate", "--engine", str(slab_engine_file), "--model", str(tmp_path)]
    assert main(args + ["--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {slab_engine_file} cannot load {tmp_path}: ")
    assert "has shape" in err and "the one its weights were saved with" in err
    assert err.count("\n") == 1
