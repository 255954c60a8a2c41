"""`serve`: the OpenAI-compatible server over SmolLM2 (a 512-token context), driven by the openai
client: completions and chat, whole and streamed; 16 concurrent greedy requests equal the
engine's own greedy tokens while joining and leaving the batch; logprobs are the engine's; bad
input (hostile too) gets a 4xx with its message, a body over the limit a 413; an engine failure
is a 500 for that request only; a client that leaves mid-stream frees its request; 1,000
requests over a toy model leave nothing behind; start-up errors are one line and exit code 2."""

import asyncio
import ctypes
import gc
import http.client
import json
import math
import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("fastapi", reason='serve needs its extra: pip install -e ".[serve]"')
uvicorn = pytest.importorskip("uvicorn", reason='serve needs its extra: pip install -e ".[serve]"')
openai = pytest.importorskip("openai", reason="the tests drive the server with the openai client")
pytest.importorskip("tokenizers", reason='serve needs tokenizers: pip install -e ".[serve]"')

from search.cli import build_parser, main  # noqa: E402
from serving.generate import generate_tokens  # noqa: E402
from variants.serving.sampling import greedy_tokens  # noqa: E402

POISON = [0, 0, 0]  # prompts starting with three <|endoftext|> make the engine fail (below)
PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
    "1, 2, 3, 4,",
    "Water boils at",
    "The largest planet in the solar system is",
    "import numpy as",
    "A haiku about the sea:",
    "The opposite of hot is",
    "My favourite food is",
    "In 1969, humans",
    "The quick brown fox",
    "Photosynthesis is the process",
    "To be or not to be,",
    "Héllo wörld, ça va? 🙂",
]
CHAT = "What is the capital of France? One word."


class RecordingEngine:
    """The engine with each call's request ids recorded (to see the batching) and a fault
    injected into prefills of POISON prompts, after the call ran, as a bug would."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def prefill(self, ids, prompts):
        self.calls.append(("prefill", list(ids)))
        out = self.engine.prefill(ids, prompts)
        if any(p[:3].tolist() == POISON for p in prompts):
            raise RuntimeError("injected fault")
        return out

    def decode(self, ids, tokens):
        self.calls.append(("decode", list(ids)))
        return self.engine.decode(ids, tokens)

    def remove(self, ids):
        self.calls.append(("remove", list(ids)))
        self.engine.remove(ids)


def running_server(folder, engine_file, max_live: int, prefill_tokens: int):
    """The server of `serve` in a thread of this process, over a RecordingEngine of the engine
    file on the model folder, on a free port of 127.0.0.1 (yields it, then stops it)."""
    from serving.openai_api import create_app
    from serving.serve import listen, load_engine, load_served_model
    from variants.serving.engine_loop import EngineLoop

    args = ["serve", "--engine", str(engine_file), "--model", str(folder), "--model-name", "smol"]
    args = build_parser().parse_args(args + ["--device", "cpu"])
    served, config = load_served_model(args)
    engine = RecordingEngine(load_engine(args.engine, config, args.model, "cpu"))
    loop = EngineLoop(engine, max_live=max_live, prefill_token_budget=prefill_tokens).start()
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(create_app(loop, served), log_level="warning"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120
    )
    yield SimpleNamespace(port=port, client=client, loop=loop, engine=engine, model=served)
    uv.should_exit = True
    thread.join(10)
    loop.close()


@pytest.fixture(scope="session")
def server(smollm2_short_dir, slab_engine_file):
    """Over SmolLM2: at most 8 live requests and 64 prompt tokens per prefill step."""
    yield from running_server(smollm2_short_dir, slab_engine_file, 8, 64)


@pytest.fixture(scope="module")
def tiny_server(smollm2_short_dir, slab_engine_file, tiny_config, tmp_path_factory):
    """Over a two-layer model of toy weights with SmolLM2's tokenizer and vocabulary (the
    server's work without most of the model's): at most 16 live requests."""
    from evaluator.toy_weights import save_toy_weights

    folder = tmp_path_factory.mktemp("tiny_smol")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).symlink_to(smollm2_short_dir / name)
    config = dict(tiny_config, vocab_size=49152, eos_token_id=2, torch_dtype="float32")
    (folder / "config.json").write_text(json.dumps(config))
    save_toy_weights(config, folder / "model.pt", seed=7, head_scale=10.0)
    yield from running_server(folder, slab_engine_file, 16, 512)


@pytest.fixture(scope="session")
def greedy(smollm2_engine, server):
    """The engine's own greedy tokens for PROMPTS (8 each, or to EOS), computed without the
    server (on another engine of the same file), and `expect(i, n)`: prompt i's text and
    finish reason at max_tokens n."""
    tokenizer = server.model.tokenizer
    prompts = [tokenizer.encode(p).ids for p in PROMPTS]
    with torch.no_grad():
        out = generate_tokens(smollm2_engine, prompts, greedy_tokens, 8, {2}, 512, "cpu")

    def expect(i, n):
        tokens = out.tokens[i][:n]
        reason = "stop" if tokens[-1] == 2 else "length"
        return tokenizer.decode(tokens, skip_special_tokens=True), reason

    return expect


def raw(server, method, path, body=None, stream=False):
    """(status, parsed JSON body) of one plain HTTP request; `body` bytes go as they are."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    conn.request(method, path, data, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if stream:
        return conn, response
    try:
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_models_and_health(server):
    assert [m.id for m in server.client.models.list().data] == ["smol"]
    assert raw(server, "GET", "/health") == (200, {"status": "ok", "waiting": 0, "running": 0})


def test_completion_whole_and_streamed(server, greedy):
    text, reason = greedy(0, 8)
    assert (text, reason) == (" Paris.\n\nThe answer is:", "length")
    args = dict(model="smol", prompt=PROMPTS[0], max_tokens=8, temperature=0)
    reply = server.client.completions.create(**args)
    assert reply.choices[0].text == text and reply.choices[0].finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (5, 8)
    chunks = list(server.client.completions.create(**args, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == text
    assert [c.choices[0].finish_reason for c in chunks][-2:] == [None, "length"]
    stopped = server.client.completions.create(**args, stop=["\n", "."])
    assert stopped.choices[0].text == " Paris" and stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens == 2  # " Paris", "."
    both = server.client.completions.create(**dict(args, max_tokens=4, prompt=PROMPTS[2:4]))
    assert [(c.index, c.text) for c in both.choices] == [(0, greedy(2, 4)[0]), (1, greedy(3, 4)[0])]
    sampled = dict(args, temperature=0.8, top_p=0.9, seed=3)
    texts = [server.client.completions.create(**sampled).choices[0].text for _ in range(2)]
    assert texts[0] == texts[1] != text  # replayed by its seed


def test_chat_whole_and_streamed(server):
    text = "The capital of France is Paris."  # test_generate: transformers' greedy reply
    args = dict(model="smol", messages=[{"role": "user", "content": CHAT}], temperature=0)
    reply = server.client.chat.completions.create(**args, max_tokens=16)
    choice = reply.choices[0]
    assert (choice.message.role, choice.message.content) == ("assistant", text)
    assert choice.finish_reason == "stop" and reply.usage.completion_tokens == 8  # EOS counted
    options = {"include_usage": True}
    chunks = list(
        server.client.chat.completions.create(**args, stream=True, stream_options=options)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks[-3:-1]] == [None, "stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage == reply.usage


def test_logprobs_are_the_engines(server, smollm2_engine):
    """Chat's logprobs with 3 top_logprobs, and completions' logprobs=3, streamed or not: each
    token's log-probability under the engine's own logits (before the temperature)."""
    tokenizer = server.model.tokenizer
    prompt = tokenizer.encode(PROMPTS[0]).ids
    with torch.no_grad():
        logits = smollm2_engine.prefill([100], [torch.tensor(prompt)])
    smollm2_engine.remove([100])
    first = logits[0].float().log_softmax(-1).topk(3)
    want = [(tokenizer.decode([int(i)]), v) for i, v in zip(first.indices, first.values.tolist())]
    args = dict(model="smol", prompt=PROMPTS[0], max_tokens=4, temperature=0.5, seed=1)
    whole = server.client.completions.create(**args, logprobs=3).choices[0]
    tops = whole.logprobs.top_logprobs
    assert list(tops[0]) == [t for t, _ in want]  # the sampled token among them
    assert list(tops[0].values()) == pytest.approx([v for _, v in want], abs=1e-4)
    assert "".join(whole.logprobs.tokens) == whole.text and len(tops) == 4
    assert whole.logprobs.text_offset == [0, 6, 7, 8] and whole.text[6:8] == ".\n"
    chunks = list(server.client.completions.create(**args, logprobs=3, stream=True))
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert streamed == whole.logprobs.tokens
    offsets = [
        o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset
    ]
    assert offsets == whole.logprobs.text_offset
    messages = [{"role": "user", "content": CHAT}]
    chat = dict(model="smol", messages=messages, max_tokens=8, temperature=0)
    reply = server.client.chat.completions.create(**chat, logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    text = "The capital of France is Paris."  # and the EOS, a token of the answer too
    assert reply.choices[0].message.content == text
    assert "".join(t.token for t in content) == text + "<|im_end|>"
    assert all(len(t.top_logprobs) == 3 for t in content)
    for t in content:  # greedy: the token is the most likely; bytes are its UTF-8
        assert (t.top_logprobs[0].token, t.top_logprobs[0].logprob) == (t.token, t.logprob)
        assert bytes(t.bytes) == t.token.encode() and t.logprob <= 0
        assert sum(math.exp(a.logprob) for a in t.top_logprobs) <= 1 + 1e-5
    chunks = list(
        server.client.chat.completions.create(**chat, logprobs=True, top_logprobs=3, stream=True)
    )
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert streamed == content
    plain = server.client.chat.completions.create(**chat, logprobs=True).choices[0].logprobs
    assert [(t.token, t.top_logprobs) for t in plain.content] == [(t.token, []) for t in content]
    assert server.client.chat.completions.create(**chat).choices[0].logprobs is None


def test_sixteen_concurrent_requests_equal_the_engines_greedy_tokens(server, greedy):
    max_new = [4 + i % 5 for i in range(len(PROMPTS))]
    start = len(server.engine.calls)

    def ask(i):
        args = dict(model="smol", prompt=PROMPTS[i], max_tokens=max_new[i], temperature=0)
        if i % 2:
            chunks = list(server.client.completions.create(**args, stream=True))
            return "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
        reply = server.client.completions.create(**args)
        return reply.choices[0].text, reply.choices[0].finish_reason

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(ask, range(len(PROMPTS))))
    for i, (text, reason) in enumerate(answers):
        assert (text, reason) == greedy(i, max_new[i]), PROMPTS[i]
    live, joined, most = set(), 0, 0
    for op, ids in server.engine.calls[start:]:
        if op == "prefill":
            joined += bool(live)  # admitted while others were decoding
            live |= set(ids)
        elif op == "remove":
            live -= set(ids)
        most = max(most, len(live))
    assert most == 8 and joined and not live  # the cap, joins, and every request removed


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        ("/v1/completions", b"{bad", 400, "the body is not valid JSON: Expecting property name"),
        ("/v1/completions", b"[1]", 400, "the body must be a JSON object"),
        ("/v1/completions", b"", 400, "the body must be a JSON object, sent as Content-Type: "),
        ("/v1/completions", b'{"prompt": "\xff"}', 400,
         "the body is not valid JSON: 'utf-8' codec can't decode byte 0xff in position 12"),
        ("/v1/completions", b'{"prompt": ' + b"[" * 10**5 + b"]" * 10**5 + b"}", 400,
         "the body is not valid JSON: maximum recursion depth exceeded"),
        ("/v1/completions", {"model": "smol"}, 400, "prompt: Field required"),
        ("/v1/completions", {"prompt": ""}, 400, "prompt is empty: give at least one token"),
        ("/v1/completions", {"prompt": 5}, 400, "prompt: must be a string, a list of strings"),
        ("/v1/completions", {"prompt": [49152]}, 400, "prompt: token id 49152 is outside"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400,
         "max_tokens: Input should be greater than or equal to 1"),
        ("/v1/completions", {"prompt": "x", "max_tokens": "5"}, 400,
         "max_tokens: Input should be a valid integer"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 512}, 400,
         "max_tokens is 512, but the prompt has 1 token and the context 512: ask for at most 511"),
        ("/v1/completions", {"prompt": [1] * 512}, 400,
         "the prompt has 512 tokens and the model's context is 512: no room for a completion"),
        ("/v1/completions", {"prompt": "x", "temperature": -1}, 400,
         "temperature: Input should be greater than or equal to 0"),
        ("/v1/completions", {"prompt": "x", "temperature": 1e-300}, 400,
         "temperature: 1e-300 is too small to sample with: give 0 for greedy decoding, or at "
         "least 1e-05"),
        ("/v1/completions", {"prompt": ["x", "y"], "seed": 2**63}, 400,
         "seed: must be in [0, 2**63 - 1], got 9223372036854775808; leave it out for a random"),
        ("/v1/completions", {"prompt": "x", "seed": -1}, 400,
         "seed: must be in [0, 2**63 - 1], got -1; leave it out for a random one"),
        ("/v1/completions", {"prompt": "x", "stop": 3}, 400,
         "stop: must be a string or a list of strings"),
        ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404,
         "the model 'gpt-4' does not exist: this server has 'smol'"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages: List should have at least 1"),
        ("/v1/chat/completions", {"messages": [{"role": "bot", "content": "x"}]}, 400,
         "messages.0.role: Input should be 'system', 'developer', 'user' or 'assistant'"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 1}]}, 400,
         "messages.0.content: must be a string or a list of"),
        ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, 400,
         "messages.0.role: Input should be 'system', 'developer', 'user' or 'assistant'"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "name": "a"}]},
         400, "messages.0.name: this server has no such field: leave it out"),
        ("/v1/nothing", {}, 404, "Not Found"),
        # text that is not Unicode: JSON's escapes spell lone surrogates
        ("/v1/completions", b'{"prompt": "ab\\ud800"}', 400,
         "prompt: not valid Unicode: a lone surrogate '\\ud800' at character 2; send whole"),
        ("/v1/completions", b'{"prompt": ["x", "\\udfff"]}', 400,
         "prompt: not valid Unicode: a lone surrogate '\\udfff' at character 0"),
        ("/v1/completions", b'{"prompt": "x", "stop": ["\\ud83d"]}', 400,
         "stop: not valid Unicode: a lone surrogate '\\ud83d' at character 0"),
        ("/v1/completions", b'{"prompt": "x", "model": "\\ud800"}', 400,
         "model: not valid Unicode"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400,
         "messages.0.content: not valid Unicode: a lone surrogate '\\ud800' at character 0"),
        ("/v1/chat/completions",
         b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}',
         400, "messages.0.content: not valid Unicode: a lone surrogate '\\udc00'"),
        # NaN and Infinity (Python's json writes them so) said as such
        ("/v1/completions", b'{"prompt": "x", "temperature": NaN}', 400,
         "temperature: must be a finite number, got NaN"),
        ("/v1/completions", b'{"prompt": "x", "top_p": Infinity}', 400,
         "top_p: must be a finite number, got Infinity"),
        ("/v1/chat/completions",
         b'{"messages": [{"role": "user", "content": "x"}], "temperature": -Infinity}', 400,
         "temperature: must be a finite number, got -Infinity"),
        ("/v1/completions", {"prompt": [-1]}, 400, "prompt: token id -1 is outside the vocabulary"),
        ("/v1/completions", {"prompt": [[1], [2**70]]}, 400,
         "prompt 1: token id 1180591620717411303424 is outside the vocabulary [0, 49152)"),
        ("/v1/completions", {"prompt": "é" * 20737}, 400,
         "prompt is 41,474 bytes, more than 512 tokens of this tokenizer can hold (41,472 bytes"),
        # stop lists
        ("/v1/completions", {"prompt": "x", "stop": ""}, 400,
         "stop: an empty string stops nothing: leave it out"),
        ("/v1/completions", {"prompt": "x", "stop": ["a", ""]}, 400, "stop: an empty string"),
        ("/v1/completions", {"prompt": "x", "stop": ["a", None]}, 400,
         "stop: must be a string or a list of strings"),
        ("/v1/completions", {"prompt": "x", "stop": [["a"]]}, 400, "stop: must be a string or"),
        ("/v1/completions", {"prompt": "x", "stop": ["a"] * 17}, 400,
         "stop: at most 16 strings, got 17"),
        # what this server does not do is refused by name, not dropped
        ("/v1/completions", {"prompt": "x", "max_token": 5}, 400,
         "max_token: this server has no such field: leave it out"),
        ("/v1/completions", {"prompt": "x", "n": 2}, 400,
         "n: not supported by this server: leave it out"),
        ("/v1/completions", {"prompt": "x", "echo": True}, 400, "echo: not supported"),
        ("/v1/completions", {"prompt": "x", "presence_penalty": 0.5}, 400,
         "presence_penalty: not supported"),
        ("/v1/completions", {"prompt": "x", "logprobs": 21}, 400,
         "logprobs: Input should be less than or equal to 20"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
         "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
         "tools: not supported by this server: leave it out"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
         "response_format": {"type": "json_object"}}, 400, "response_format: not supported"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
         "top_logprobs": 3}, 400, "top_logprobs: needs logprobs: true as well"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
         "logprobs": 1}, 400, "logprobs: Input should be a valid boolean"),
    ],
)  # fmt: skip
def test_bad_input_gets_a_4xx_and_the_server_goes_on(server, path, body, status, message):
    got, reply = raw(server, "POST", path, body)
    assert got == status and reply["error"]["message"].startswith(message)
    assert reply["error"]["type"] == "invalid_request_error"
    assert raw(server, "GET", "/health")[0] == 200


def test_fields_that_change_nothing_are_taken(server, greedy):
    """OpenAI's defaults of the fields this server does not implement, sent as some clients
    send them, change nothing."""
    no_ops = dict(n=1, presence_penalty=0, frequency_penalty=0.0, logit_bias={}, user="u")
    args = dict(model="smol", prompt=PROMPTS[0], max_tokens=8, temperature=0, seed=0)
    reply = server.client.completions.create(**args, **no_ops, echo=False, best_of=1)
    assert reply.choices[0].text == greedy(0, 8)[0]
    chat = dict(model="smol", messages=[{"role": "user", "content": CHAT}], max_tokens=2)
    reply = server.client.chat.completions.create(
        **chat, **no_ops, temperature=0, tool_choice="none", response_format={"type": "text"}
    )
    assert reply.choices[0].message.content == "The capital"
    nulls = dict.fromkeys(["stream", "logprobs", "top_logprobs", "tools", "n", "stop", "seed"])
    got, body = raw(server, "POST", "/v1/chat/completions", dict(chat, temperature=0, **nulls))
    assert got == 200 and body["choices"][0]["message"]["content"] == "The capital"


def test_a_body_over_the_limit_gets_413_before_it_is_read(server):
    """6 MiB: refused by its Content-Length, and sent in chunks without one, by the bytes
    counted as they come."""
    big = json.dumps({"prompt": "x", "junk": "a" * (6 << 20)}).encode()
    got, reply = raw(server, "POST", "/v1/completions", big)
    assert got == 413 and reply["error"]["message"].startswith(
        "the body is over this server's limit of 4,194,304 bytes: send less"
    )
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    chunks = (big[i : i + (1 << 20)] for i in range(0, len(big), 1 << 20))
    conn.request("POST", "/v1/completions", chunks, {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 413 and json.loads(response.read())["error"]["param"] is None
    conn.close()
    assert raw(server, "GET", "/health")[0] == 200


def test_the_openai_client_sees_bad_input_as_its_errors(server):
    with pytest.raises(openai.BadRequestError, match="max_tokens: Input should be greater"):
        server.client.completions.create(model="smol", prompt="x", max_tokens=0)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        server.client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "x"}]
        )


def test_an_engine_failure_fails_that_request_only(server, greedy):
    text, _ = greedy(1, 8)
    args = dict(model="smol", max_tokens=8, temperature=0)
    stream = server.client.completions.create(**args, prompt=PROMPTS[1], stream=True)
    chunks = [next(stream)]  # decoding when the failing prompt arrives
    for kind in (False, True):
        with pytest.raises(openai.InternalServerError, match="RuntimeError: injected fault"):
            server.client.completions.create(**args, prompt=POISON + [1, 2], stream=kind)
    chunks += list(stream)
    assert "".join(c.choices[0].text for c in chunks) == text
    assert server.engine.engine.lengths == {}  # the failed request's state was removed too


def wait_until_idle(server, seconds=20) -> dict:
    deadline = time.monotonic() + seconds
    while (health := raw(server, "GET", "/health")[1])["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return health


def test_a_client_that_leaves_mid_stream_frees_its_request(server):
    body = {"model": "smol", "prompt": PROMPTS[1], "max_tokens": 400, "stream": True}
    conn, response = raw(server, "POST", "/v1/completions", body, stream=True)
    assert response.status == 200 and response.readline().startswith(b"data: {")
    assert raw(server, "GET", "/health")[1]["running"] == 1
    conn.close()
    assert wait_until_idle(server) == {"status": "ok", "waiting": 0, "running": 0}
    assert server.engine.engine.lengths == {}
    conn = http.client.HTTPConnection("127.0.0.1", server.port)  # the same, not streamed
    headers = {"Content-Type": "application/json"}
    conn.request("POST", "/v1/completions", json.dumps(dict(body, stream=False)), headers)
    deadline = time.monotonic() + 20
    while not raw(server, "GET", "/health")[1]["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    conn.close()
    assert wait_until_idle(server)["running"] == 0 and server.engine.engine.lengths == {}


def test_start_up_errors_are_one_line(smollm2_short_dir, slab_engine_file, tmp_path, capsys):
    base = ["serve", "--engine", str(slab_engine_file), "--model", str(smollm2_short_dir)]
    taken = socket.create_server(("127.0.0.1", 0))
    no_tokenizer = tmp_path / "model"
    no_tokenizer.mkdir()
    (no_tokenizer / "config.json").write_text((smollm2_short_dir / "config.json").read_text())
    cases = [
        (["--engine", str(tmp_path / "x.py")], "engine file not found: "),
        (["--model", str(tmp_path / "none")], "is not a folder: give the model folder"),
        (["--model", str(no_tokenizer)], "no tokenizer.json in "),
        (["--port", str(taken.getsockname()[1])], "cannot listen on 127.0.0.1:"),
        (["--max-live", "0"], "--max-live and --max-prefill-tokens must be >= 1"),
        (["--max-body-mib", "nan"], "--max-body-mib must be a number > 0, got nan"),
        (["--device", "tpu"], "--device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
    ]
    with taken:
        for change, message in cases:
            assert main(base + ["--port", "0"] + change) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith("error: ") and message in err


def test_a_prompt_that_cannot_be_submitted_takes_back_the_requests_submitted_before_it():
    from serving.openai_api import Job, ServedModel
    from serving.openai_schema import CompletionBody

    class Loop:  # submits one prompt, then fails
        def __init__(self):
            self.live, self.cancelled = [], []

        def submit(self, prompt, n, post, eos, sampler):
            if self.live:
                raise RuntimeError("the engine loop is closed")
            self.live.append(7)
            return 7

        def cancel(self, rid):
            self.cancelled.append(rid)

    model = ServedModel("m", None, None, frozenset(), 512, 256, "cpu")
    body = CompletionBody(prompt=["a", "b"], seed=2**63 - 1, temperature=1.0)
    loop = Loop()

    async def make():
        Job(loop, model, [[1], [2]], [4, 4], body)

    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(make())
    assert loop.cancelled == [7]


def rss_mib() -> float:
    """This process's resident memory (Linux), the server's included: it runs in a thread."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def settled(server, calls: int) -> tuple:
    """(Python objects, resident MiB, tokens decoded) once the engine is idle, the recording of
    its calls cut back to `calls` entries (the test's own, not the server's)."""
    assert wait_until_idle(server) == {"status": "ok", "waiting": 0, "running": 0}
    decoded = sum(len(ids) for op, ids in server.engine.calls[calls:] if op == "decode")
    del server.engine.calls[calls:]
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)  # glibc keeps memory freed: give it back, to count the rest
    return len(gc.get_objects()), rss_mib(), decoded


async def soak(server, n: int) -> list:
    """n greedy requests, 16 at a time: completions (some with logprobs) and chat, whole,
    streamed, and streamed but left after the first text (every third); returns, for each,
    (how it went, its text, completion tokens, finish reason)."""
    url = f"http://127.0.0.1:{server.port}/v1"
    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
    gate = asyncio.Semaphore(16)

    async def one(i: int):
        kind, chat = ("whole", "streamed", "left")[i % 3], i % 2
        args = dict(model="smol", temperature=0, max_tokens=64 if kind == "left" else 4)
        options = {"stream_options": {"include_usage": True}} if kind == "streamed" else {}
        if chat:
            call = client.chat.completions.create
            args["messages"] = [{"role": "user", "content": PROMPTS[i % 16]}]
            text = lambda c: c.choices[0].delta.content or "" if c.choices else ""
        else:
            call = client.completions.create
            args.update(prompt=PROMPTS[i % 16], logprobs=2 if i % 4 == 1 else None)
            text = lambda c: c.choices[0].text if c.choices else ""
        async with gate:
            if i % 50 == 0:
                gc.collect(1)  # here, in the client's thread (see below)
            if kind == "whole":
                reply = await call(**args)
                got = reply.choices[0].message.content if chat else reply.choices[0].text
                return kind, got, reply.usage.completion_tokens, reply.choices[0].finish_reason
            got, reason, usage = "", None, None
            async with await call(**args, stream=True, **options) as stream:
                async for chunk in stream:
                    got += text(chunk)
                    reason = chunk.choices[0].finish_reason if chunk.choices else reason
                    usage = chunk.usage or usage
                    if kind == "left" and got:
                        return kind, got, None, reason  # the client leaves mid-stream
            return kind, got, usage.completion_tokens, reason

    # The collector runs in whichever thread allocates, the server's too, where it would close
    # the client's async generators left open (their streams): only here, in the client's.
    gc.disable()
    try:
        return await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await client.close()
        gc.enable()


@pytest.mark.timeout(300)
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and calls glibc's malloc_trim")
def test_a_soak_of_1000_requests_leaves_nothing_behind(tiny_server):
    """1,000 requests through the openai client, a third left mid-stream: each answered in
    full or left with some text, and afterwards the engine holds no request and the server's
    memory (Python's objects, and the resident memory with a margin for the allocator) is where
    it was after a warm-up of 100."""
    server = tiny_server
    calls = len(server.engine.calls)
    asyncio.run(soak(server, 100))
    objects, rss, _ = settled(server, calls)
    answers = asyncio.run(asyncio.wait_for(soak(server, 1000), 240))
    after_objects, after_rss, decoded = settled(server, calls)
    kinds = [a[0] for a in answers]
    assert (kinds.count("whole"), kinds.count("streamed"), kinds.count("left")) == (334, 333, 333)
    for kind, text, tokens, reason in answers:
        if kind == "left":
            assert text and reason is None
        else:  # 4 tokens, or fewer to the EOS
            assert text and (tokens, reason) in [(4, "length"), *((n, "stop") for n in range(1, 4))]
    assert server.engine.engine.lengths == {} and server.loop._callbacks == {}
    assert decoded < 667 * 3 + 333 * 8  # a request left was stopped, not decoded to 64 tokens
    assert after_objects - objects < 1000  # fewer than one a request: a leak leaves dozens
    assert after_rss - rss < 16  # less than 16 KiB a request
