"""The OpenAI-compatible HTTP API of `python -m search serve` (FastAPI): /v1/completions and
/v1/chat/completions (Server-Sent Events when `stream`), /v1/models and /health, over one
EngineLoop. Bad input gets a 4xx with OpenAI's error body (a body over the limit a 413, refused
as it comes in); a request the engine fails gets a 500 and the others go on; a client that leaves
frees its requests. Needs the `serve` extra."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass
from functools import cached_property

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

from serving.openai_schema import (
    APIError,
    ChatBody,
    ChatFormat,
    CompletionBody,
    CompletionFormat,
    chat_prompt,
    completion_prompts,
    validation_error,
)
from serving.text_stream import TextStream
from variants.serving.engine_loop import EngineLoop
from variants.serving.sampling import SamplingParams, TokenSampler, greedy_tokens

log = logging.getLogger(__name__)


@dataclass
class ServedModel:
    name: str
    tokenizer: object  # tokenizers.Tokenizer
    render_chat: object  # messages -> text (serving.chat_template.chat_renderer), or None
    eos_ids: frozenset
    max_positions: int
    vocab_size: int
    device: str  # where the engine's logits are: the samplers' generators live there
    created: int = 0
    token_texts: tuple = ()  # each id's text alone (special tokens spelled), for logprobs

    @cached_property
    def prompt_bytes(self) -> int:
        """The most UTF-8 bytes a prompt of the whole context can have: every token the
        vocabulary's longest (what a text is checked against before it is tokenized)."""
        return self.max_positions * max((len(t.encode()) for t in self.token_texts), default=0)


def token_texts(tokenizer, vocab_size: int) -> tuple:
    """Each id's text alone; "" for ids of the model's vocabulary past the tokenizer's."""
    return tuple(
        tokenizer.decode_batch([[i] for i in range(vocab_size)], skip_special_tokens=False)
    )


class LogprobSampler:
    """A request's sampler that also keeps, for each token it picks, the token's log-probability
    and the `top` most likely tokens' under the model's own distribution (the logits before
    temperature and filters, as vLLM gives them). Called on the engine thread."""

    def __init__(self, sampler, top: int):
        self.sampler, self.top = sampler or greedy_tokens, top
        self.picked: list = []  # (logprob, [(id, logprob), ...]) per token, in order

    def __call__(self, logits):
        token = self.sampler(logits)
        logprobs = logits[0].float().log_softmax(-1)
        best = logprobs.topk(self.top)
        top = list(zip(best.indices.tolist(), best.values.tolist()))
        self.picked.append((logprobs[token].item(), top))
        return token


class Job:
    """One HTTP request's prompts in the engine loop, seen from the event loop: `deltas` yields
    their new text as tokens come; `cancel` frees the rest."""

    def __init__(self, engine: EngineLoop, model: ServedModel, prompts: list, max_new: list, body):
        self.engine, self.prompts, self.model = engine, prompts, model
        self.events: asyncio.Queue = asyncio.Queue()
        self.texts = [TextStream(model.tokenizer, body.stop) for _ in prompts]
        self.reasons = [None] * len(prompts)
        temperature = 1.0 if body.temperature is None else body.temperature
        params = SamplingParams(temperature, body.top_k, body.top_p or 1.0)
        seed = uuid.uuid4().int % 2**62 if body.seed is None else body.seed
        aio = asyncio.get_running_loop()
        samplers = [TokenSampler(params, seed + i, model.device) if temperature else None
                    for i in range(len(prompts))]  # fmt: skip
        self.top = body.alternatives
        if self.top is not None:
            samplers = [LogprobSampler(s, self.top) for s in samplers]
        self.samplers = samplers
        self.ids, put = [], self.events.put_nowait
        try:  # a prompt that cannot be submitted takes back those that were
            for i, (prompt, n, sampler) in enumerate(zip(prompts, max_new, samplers)):
                post = lambda event, i=i: aio.call_soon_threadsafe(put, (i, event))
                self.ids.append(engine.submit(prompt, n, post, model.eos_ids, sampler))
        except BaseException:
            self.cancel()
            raise

    async def deltas(self):
        """(prompt index, new text, finish reason or None, its tokens' logprobs or None)."""
        while None in self.reasons:
            i, event = await self.events.get()
            stream = self.texts[i]
            if self.reasons[i] is not None:  # ended by a stop string; more was on its way
                continue
            if event.error is not None:
                raise APIError(500, f"the engine failed this request: {event.error}")
            start = len(stream.ids)
            text = "".join(stream.push(t) for t in event.tokens if not stream.stopped)
            picked = self.picked(i, start)
            if stream.stopped:
                self.engine.cancel(self.ids[i])
                self.reasons[i] = "stop"
            elif event.finish_reason is not None:
                text += stream.flush()
                self.reasons[i] = event.finish_reason
            yield i, text, self.reasons[i], picked

    def picked(self, i: int, start: int):
        """Prompt i's tokens from `start` with their logprobs (the sampler kept them before
        the tokens were posted), as texts."""
        if self.top is None:
            return None
        text, ids = self.model.token_texts, self.texts[i].ids[start:]
        kept = self.samplers[i].picked[start : start + len(ids)]
        return [(text[t], p, [(text[a], q) for a, q in top]) for t, (p, top) in zip(ids, kept)]

    def cancel(self) -> None:
        for rid, reason in zip(self.ids, self.reasons):
            if reason is None:
                self.engine.cancel(rid)

    def usage(self) -> dict:
        prompt, completion = sum(map(len, self.prompts)), sum(len(t.ids) for t in self.texts)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }


class EventStream(StreamingResponse):
    """Server-Sent Events whose generator is closed however the response ends (a client that
    disconnects too), so that its `finally` frees the engine's requests."""

    def __init__(self, events):
        super().__init__(events, media_type="text/event-stream")

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


def _sse(data) -> str:
    return f"data: {json.dumps(data)}\n\n"


async def _stream(job: Job, form, deltas, first, include_usage: bool):
    try:
        for chunk in form.opening():
            yield _sse(chunk)
        delta = first
        while delta is not None:
            for chunk in form.chunks(*delta):
                yield _sse(chunk)
            delta = await anext(deltas, None)
        if include_usage:
            yield _sse(form.usage_chunk(job.usage()))
    except APIError as exc:  # after the 200 went out: the error as an event
        yield _sse({"error": exc.body()})
    finally:
        job.cancel()
    yield "data: [DONE]\n\n"


async def _whole(job: Job, form) -> dict:
    texts, picked = [""] * len(job.prompts), [None if job.top is None else [] for _ in job.prompts]
    async for index, text, _, tokens in job.deltas():
        texts[index] += text
        picked[index] = None if tokens is None else picked[index] + tokens
    return form.whole(texts, job.reasons, job.usage(), picked)


class BodyLimit:
    """ASGI middleware refusing a body over `limit` bytes with a 413: by its Content-Length
    before any of it is read, else (chunked) as soon as the bytes read pass it. (Starlette's
    own limiter answers the first case in plain text whatever the app answers: no OpenAI
    error body.)"""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        length = Headers(scope=scope).get("content-length", "") if scope["type"] == "http" else ""
        if length.isdigit() and int(length) > self.limit:
            return await too_large(self.limit).response()(scope, receive, send)
        read = 0

        async def counted():
            nonlocal read
            message = await receive()
            read += len(message.get("body", b""))
            if read > self.limit:  # (FastAPI hands an HTTPException of the body on as it is)
                raise HTTPException(413)
            return message

        await self.app(scope, counted, send)


def too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"the body is over this server's limit of {limit:,} bytes: send less (or start serve "
        "with a larger --max-body-mib)",
    )


def tokens(n: int) -> str:
    return f"{n} token{'s' * (n != 1)}"


def internal_error(request, exc: Exception) -> JSONResponse:
    """(Starlette re-raises it afterwards, and uvicorn logs the traceback.)"""
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(engine: EngineLoop, model: ServedModel, max_body_bytes: int = 4 << 20) -> FastAPI:
    """The app over `engine`; a body over `max_body_bytes` gets a 413."""
    app = FastAPI(title="search serve", summary=f"OpenAI-compatible API over {model.name}")
    app.add_middleware(BodyLimit, limit=max_body_bytes)

    def http_error(request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 413:
            return too_large(max_body_bytes).response()
        if exc.status_code == 400 and exc.__cause__ is not None:  # not UTF-8, nested too deep
            return APIError(400, f"the body is not valid JSON: {exc.__cause__}").response()
        return APIError(exc.status_code, str(exc.detail)).response()

    app.add_exception_handler(APIError, lambda request, exc: exc.response())
    app.add_exception_handler(
        RequestValidationError, lambda request, exc: validation_error(exc.errors()[0]).response()
    )
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)

    def budget(prompt: list, max_tokens, param: str) -> int:
        """max_tokens, or what the context leaves (OpenAI: prompt + completion fit in it)."""
        room, ctx, n = model.max_positions - len(prompt), model.max_positions, len(prompt)
        code = "context_length_exceeded"
        if room < 1:
            message = f"the prompt has {tokens(n)} and the model's context is {ctx}: no room"
            raise APIError(400, f"{message} for a completion", param, code)
        if max_tokens is not None and max_tokens > room:
            message = f"max_tokens is {max_tokens}, but the prompt has {tokens(n)}"
            raise APIError(
                400, f"{message} and the context {ctx}: ask for at most {room}", "max_tokens", code
            )
        return room if max_tokens is None else max_tokens

    async def answer(request: Request, body, prompts: list, param: str, form_type):
        if body.model is not None and body.model != model.name:
            message = f"the model {body.model!r} does not exist: this server has {model.name!r}"
            raise APIError(404, message, "model", "model_not_found")
        max_new = [budget(p, body.max_tokens, param) for p in prompts]
        meta = {"id": f"{form_type.prefix}-{uuid.uuid4().hex}", "created": int(time.time())}
        form = form_type(dict(meta, model=model.name))
        job = Job(engine, model, prompts, max_new, body)
        if body.stream:
            deltas = job.deltas()
            try:
                first = await anext(deltas)  # a failure of the first token is still a 500
            except BaseException:
                job.cancel()
                raise
            return EventStream(_stream(job, form, deltas, first, body.include_usage))
        whole = asyncio.ensure_future(_whole(job, form))
        gone = asyncio.ensure_future(_until_disconnect(request))
        try:
            await asyncio.wait({whole, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            whole.cancel()
            job.cancel()
        if not whole.done():  # the client left: nobody reads this
            return Response(status_code=499)
        return JSONResponse(whole.result())

    @app.get("/health")
    async def health():
        if not engine.alive:
            raise APIError(503, "the engine thread has stopped")
        return {"status": "ok", **engine.load}

    @app.get("/v1/models")
    async def models():
        card = {
            "id": model.name,
            "object": "model",
            "created": model.created,
            "owned_by": "local",
            "max_model_len": model.max_positions,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request):
        prompts = await run_in_threadpool(  # (a long prompt must not hold up the streams)
            completion_prompts, body.prompt, model.tokenizer, model.vocab_size,
            model.prompt_bytes, model.max_positions,
        )  # fmt: skip
        return await answer(request, body, prompts, "prompt", CompletionFormat)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, request: Request):
        if model.render_chat is None:
            raise APIError(400, f"{model.name} has no chat template: use /v1/completions")
        prompt = await run_in_threadpool(
            chat_prompt, body.messages, model.render_chat, model.tokenizer,
            model.prompt_bytes, model.max_positions,
        )  # fmt: skip
        return await answer(request, body, [prompt], "messages", ChatFormat)

    return app
