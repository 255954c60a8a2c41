"""The tokenizer built from GGUF metadata: on SmolLM2 the same ids as transformers' reading of
the GGUF (text, unicode, special tokens, the chat template); on a toy vocabulary the rules."""

from collections.abc import Mapping

import pytest

from models.gguf_tokenizer import byte_level_tokenizer, tokenizer_config

STRINGS = [
    "The capital of France is",
    "  héllo wörld — 東京 🤗\n\n\tx=12.5;",
    "I'll've 1234567 don't",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "   spaces   \r\n",
    "ümlaut ß ﬁ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 Ωμέγα Привет",
    "def f(x):\n    return x**2  # 2²",
]
CHATS = [
    [{"role": "user", "content": "Wie spät ist es? 🕰"}],
    [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "What is 12 + 30?"},
        {"role": "assistant", "content": "42"},
        {"role": "user", "content": "Merci !"},
    ],
]


@pytest.fixture(scope="module")
def tokenizer_pair(smollm2_gguf, smollm2_dir):
    transformers = pytest.importorskip("transformers")
    ours = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    theirs = transformers.AutoTokenizer.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name
    )
    return ours, theirs


def test_same_ids_as_transformers_reading_the_gguf(tokenizer_pair):
    ours, theirs = tokenizer_pair
    for text in STRINGS:
        ids = ours(text)["input_ids"]
        assert ids == theirs(text)["input_ids"], text
        assert ours.decode(ids) == text
    assert ours("<|im_start|>")["input_ids"] == [1]
    special = (ours.bos_token, ours.eos_token, ours.pad_token, ours.unk_token)
    assert special == ("<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>")


def test_chat_template_gives_the_same_ids(tokenizer_pair):
    ours, theirs = tokenizer_pair
    for messages in CHATS:
        got = [
            t.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            for t in (ours, theirs)
        ]
        ids = [g["input_ids"] if isinstance(g, Mapping) else g for g in got]
        assert ids[0] == ids[1]
        assert ours.decode(ids[0]).endswith("<|im_start|>assistant\n")


def test_digits_are_split_one_by_one(smollm2_dir):
    """llama.cpp's `smollm` split: every digit alone, as SmolLM2 was trained."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    assert tokenizer.encode("in 2024").tokens == ["in", "Ġ", "2", "0", "2", "4"]


TOY = {
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "gpt-2",
    "tokenizer.ggml.tokens": ["a", "b", "ab", "Ġ", "Ġa", "Ġab", "<|end|>", "<x>", "1", "2", "12"],
    "tokenizer.ggml.merges": ["a b", "Ġ ab", "1 2"],
    "tokenizer.ggml.token_type": [1, 1, 1, 1, 1, 1, 3, 4, 1, 1, 1],
    "tokenizer.ggml.bos_token_id": 6,
    "tokenizer.ggml.eos_token_id": 6,
}


def test_toy_vocabulary_merges_and_added_tokens():
    tokenizer = byte_level_tokenizer(TOY)
    assert tokenizer.encode("ab ab<|end|><x>12").ids == [2, 5, 6, 7, 10]
    assert tokenizer.decode([2, 5, 6, 7], skip_special_tokens=True) == "ab ab<x>"
    digits = byte_level_tokenizer({**TOY, "tokenizer.ggml.pre": "smollm"})
    assert digits.encode("12").ids == [8, 9]


def test_bos_is_added_when_the_metadata_says_so():
    tokenizer = byte_level_tokenizer({**TOY, "tokenizer.ggml.add_bos_token": True})
    assert tokenizer.encode("ab").ids == [6, 2]
    assert tokenizer.encode("ab", add_special_tokens=False).ids == [2]
    config = tokenizer_config({**TOY, "tokenizer.ggml.add_bos_token": True}, 128)
    assert config["add_bos_token"] and config["bos_token"] == "<|end|>"
    assert "chat_template" not in config and config["model_max_length"] == 128


@pytest.mark.parametrize(
    "change, message",
    [
        ({"tokenizer.ggml.model": "llama"}, r"only byte-level BPE \('gpt2'\) is supported"),
        ({"tokenizer.ggml.pre": "llama-bpe"}, r"tokenizer.ggml.pre 'llama-bpe' is not supported"),
        ({"tokenizer.ggml.merges": ["a b c"]}, r"holds 'a b c', not two tokens"),
    ],
)
def test_other_tokenizers_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        byte_level_tokenizer({**TOY, **change})
