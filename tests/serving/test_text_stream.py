"""TextStream: byte-level tokens released as clean text (a split UTF-8 character waits for its
last byte), stop strings cut the text and are never released, even in part."""

import pytest

tokenizers = pytest.importorskip("tokenizers")

from serving.text_stream import TextStream  # noqa: E402


@pytest.fixture(scope="module")
def bytes_tokenizer():
    """One id per byte (the byte-level alphabet, no merges), like tests/serving/test_generate."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def pieces(tokenizer, text, stop=(), cut=None):
    ids = tokenizer.encode(text).ids[:cut]
    stream = TextStream(tokenizer, stop)
    out = [stream.push(t) for t in ids if not stream.stopped]
    return out + [stream.flush()], stream


def test_split_characters_wait_for_their_last_byte(bytes_tokenizer):
    text = "héllo wörld 🙂!"
    out, stream = pieces(bytes_tokenizer, text)
    assert len(stream.ids) == len(text.encode()) and "".join(out) == text == stream.text
    assert out[:4] == ["h", "", "é", "l"]  # é is two tokens
    assert out[-6:] == ["", "", "", "🙂", "!", ""]  # four bytes
    assert all("\ufffd" not in piece for piece in out)
    out, _ = pieces(bytes_tokenizer, text, cut=-2)  # ends inside 🙂
    assert "".join(out) == "héllo wörld \ufffd"


def test_stop_strings_cut_the_text_and_are_held_back_while_they_may_start(bytes_tokenizer):
    out, stream = pieces(bytes_tokenizer, "one, two; three", stop=["; t", "xx"])
    assert "".join(out) == stream.text == "one, two" and stream.stopped
    assert out[7:11] == ["o", "", "", ""]  # ";" and " " held, "t" completes the stop
    assert len(stream.ids) == len("one, two; t")
    out, stream = pieces(bytes_tokenizer, "a;b", stop=["; t"])
    assert out == ["a", "", ";b", ""] and not stream.stopped  # ";" held until "b" came
    out, _ = pieces(bytes_tokenizer, "a; ", stop=["; t"])
    assert out == ["a", "", "", "; "]  # the end releases what was held
    out, _ = pieces(bytes_tokenizer, "wörld", stop=["ö"])
    assert "".join(out) == "w"
