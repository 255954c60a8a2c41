"""`serve`: the OpenAI-compatible server over SmolLM2 (a 512-token context), driven by the openai
client: completions and chat, whole and streamed; 16 concurrent greedy requests equal the
engine's own greedy tokens while joining and leaving the batch; bad input gets a 4xx with its
message; an engine failure is a 500 for that request only; a client that leaves mid-stream frees
its request; start-up errors are one line and exit code 2."""

import asyncio
import http.client
import json
import socket
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


@pytest.fixture(scope="session")
def server(smollm2_short_dir, slab_engine_file):
    """The server of `serve` in a thread of this process, over a RecordingEngine, on a free
    port: at most 8 live requests and 64 prompt tokens per prefill step."""
    from serving.openai_api import create_app
    from serving.serve import listen, load_engine, load_served_model
    from variants.serving.engine_loop import EngineLoop

    folder, engine_file = str(smollm2_short_dir), str(slab_engine_file)
    args = ["serve", "--engine", engine_file, "--model", folder, "--model-name", "smol"]
    args = build_parser().parse_args(args + ["--device", "cpu"])
    served, config = load_served_model(args)
    engine = RecordingEngine(load_engine(args.engine, config, args.model, "cpu"))
    loop = EngineLoop(engine, max_live=8, prefill_token_budget=64).start()
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
        ("/v1/completions", {"model": "smol"}, 400, "prompt: Field required"),
        ("/v1/completions", {"prompt": ""}, 400, "prompt is empty: give at least one token"),
        ("/v1/completions", {"prompt": 5}, 400, "prompt: must be a string, a list of strings"),
        ("/v1/completions", {"prompt": [49152]}, 400, "prompt: token id 49152 is outside"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400,
         "max_tokens: Input should be greater than or equal to 1"),
        ("/v1/completions", {"prompt": "x", "max_tokens": "5"}, 400,
         "max_tokens: Input should be a valid integer"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 512}, 400,
         "max_tokens is 512, but the prompt has 1 tokens and the context 512: ask for at most 511"),
        ("/v1/completions", {"prompt": [1] * 512}, 400,
         "the prompt has 512 tokens and the model's context is 512: no room for a completion"),
        ("/v1/completions", {"prompt": "x", "temperature": -1}, 400,
         "temperature: Input should be greater than or equal to 0"),
        ("/v1/completions", {"prompt": ["x", "y"], "seed": 2**63}, 400,
         "seed: Input should be less than or equal to 9223372036854775807"),
        ("/v1/completions", {"prompt": "x", "stop": 3}, 400,
         "stop: must be a string or a list of strings"),
        ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404,
         "the model 'gpt-4' does not exist: this server has 'smol'"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages: List should have at least 1"),
        ("/v1/chat/completions", {"messages": [{"role": "bot", "content": "x"}]}, 400,
         "messages.0.role: Input should be 'system', 'developer', 'user' or 'assistant'"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 1}]}, 400,
         "messages.0.content: must be a string or a list of"),
        ("/v1/nothing", {}, 404, "Not Found"),
    ],
)  # fmt: skip
def test_bad_input_gets_a_4xx_and_the_server_goes_on(server, path, body, status, message):
    got, reply = raw(server, "POST", path, body)
    assert got == status and reply["error"]["message"].startswith(message)
    assert reply["error"]["type"] == "invalid_request_error"
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
