"""The request bodies of the OpenAI-compatible API (pydantic, strict: "5" is not an int) and
their prompts as token ids, with OpenAI's error type for what is wrong with them. The fields
and defaults follow OpenAI's API reference; a field this server does not implement is refused
by name unless its value changes nothing, and so is any unknown field."""

from __future__ import annotations

import json
from itertools import accumulate
from typing import Annotated, Any, Literal

from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from serving.chat_template import ChatTemplateError
from variants.serving.sampling import SEEDS


class APIError(Exception):
    """An HTTP error with OpenAI's body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param=None, code=None, kind=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.body()}, status_code=self.status)


def validation_error(error: dict) -> APIError:
    """A 400 naming the field of pydantic's complaint about a body (`loc[0]` is "body")."""
    path = [str(p) for p in error["loc"][1:]]
    if error["type"] == "json_invalid":
        reason = error.get("ctx", {}).get("error", "")
        return APIError(400, f"the body is not valid JSON: {reason}")
    if not path:
        return APIError(
            400, "the body must be a JSON object, sent as Content-Type: application/json"
        )
    if error["type"] == "extra_forbidden":
        return APIError(
            400, f"{'.'.join(path)}: this server has no such field: leave it out", path[0]
        )
    if error["type"] == "finite_number":  # NaN or Infinity, as the JSON said them
        got = json.dumps(error["input"])
        return APIError(400, f"{'.'.join(path)}: must be a finite number, got {got}", path[0])
    message = error["msg"].removeprefix("Value error, ")
    return APIError(400, f"{'.'.join(path)}: {message}", path[0])


def unicode_text(value: str) -> str:
    """`value` if it is valid Unicode: JSON's escapes can spell a lone surrogate ("\\ud800"),
    which no tokenizer takes."""
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        bad = value[exc.start]
        raise ValueError(
            f"not valid Unicode: a lone surrogate {ascii(bad)} at character {exc.start}; "
            "send whole characters (a surrogate pair or UTF-8)"
        ) from None
    return value


Text = Annotated[str, AfterValidator(unicode_text)]
MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit
MAX_STOP = 16  # stop strings a request may give (each is searched for after every token)
# Sampling below it is greedy in effect, and far below it float32 logits divided by the
# temperature overflow into NaN probabilities (vLLM's bound too)
MIN_TEMPERATURE = 1e-5


def no_op(*values):
    """A field of OpenAI's that this server does not implement: taken only when it is left
    out (null) or holds one of `values`, which change nothing."""

    def check(value):
        if value is None or any(value == v and type(value) is type(v) for v in values):
            return value
        raise ValueError("not supported by this server: leave it out")

    return Annotated[Any, AfterValidator(check)]


class Strict(BaseModel):
    """Strict types, unknown fields refused, NaN and Infinity refused as numbers."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(Strict):
    include_usage: bool = False


class SamplingBody(Strict):
    """What both endpoints take; temperature 0 is greedy."""

    model: Text | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)  # None: 1.0, as OpenAI
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)  # not OpenAI's: vLLM's extra field, 0 is off
    seed: int | None = None
    stop: Any = Field(default_factory=list)  # a list of strings once validated
    stream: bool | None = False  # (OpenAI's nullable booleans: null is their default)
    stream_options: StreamOptions | None = None
    user: Text | None = None  # OpenAI's end-user id for abuse reports: nothing to do here
    n: no_op(1) = None
    presence_penalty: no_op(0, 0.0) = None
    frequency_penalty: no_op(0, 0.0) = None
    logit_bias: no_op({}) = None

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value):
        if value and value < MIN_TEMPERATURE:
            raise ValueError(
                f"{value:g} is too small to sample with: give 0 for greedy decoding, or at "
                f"least {MIN_TEMPERATURE:g}"
            )
        return value

    @field_validator("seed")
    @classmethod
    def _seed(cls, value):
        if value is not None and not 0 <= value <= SEEDS[1]:
            raise ValueError(
                f"must be in [0, 2**63 - 1], got {value}; leave it out for a random one"
            )
        return value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value):
        stops = [] if value is None else [value] if isinstance(value, str) else value
        if not (isinstance(stops, list) and all(isinstance(s, str) for s in stops)):
            raise ValueError("must be a string or a list of strings")
        if "" in stops:
            raise ValueError("an empty string stops nothing: leave it out")
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} strings, got {len(stops)}")
        return [unicode_text(s) for s in stops]

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionBody(SamplingBody):
    prompt: Any
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # the most likely tokens, each
    echo: no_op(False) = None
    suffix: no_op("") = None
    best_of: no_op(1) = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value):
        """A list of prompts, each a string or a list of token ids."""
        ids = lambda v: isinstance(v, list) and all(type(t) is int for t in v)  # (no bools)
        if isinstance(value, str) or (ids(value) and value):
            value = [value]
        if isinstance(value, list) and value and all(isinstance(v, str) or ids(v) for v in value):
            return [unicode_text(v) if isinstance(v, str) else v for v in value]
        raise ValueError(
            "must be a string, a list of strings, a list of token ids or a list of those lists"
        )

    @property
    def alternatives(self) -> int | None:
        """How many of the most likely tokens to give with each token; None: no logprobs."""
        return self.logprobs


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Any

    @field_validator("content")
    @classmethod
    def _text(cls, value):
        """A string, or OpenAI's list of text parts joined."""
        if isinstance(value, str):
            return unicode_text(value)
        parts = value if isinstance(value, list) else [None]
        if all(isinstance(p, dict) and p.keys() == {"type", "text"} for p in parts):
            if all(p["type"] == "text" and isinstance(p["text"], str) for p in parts):
                return unicode_text("".join(p["text"] for p in parts))
        raise ValueError('must be a string or a list of {"type": "text", "text": ...} parts')


class ChatBody(SamplingBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name of max_tokens
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: no_op([]) = None
    tool_choice: no_op("none") = None
    parallel_tool_calls: no_op(True, False) = None  # (what to do with tools, which are refused)
    functions: no_op([]) = None
    function_call: no_op("none") = None
    response_format: no_op({"type": "text"}) = None

    def model_post_init(self, context) -> None:
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens

    @field_validator("top_logprobs")
    @classmethod
    def _with_logprobs(cls, value, info):
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("needs logprobs: true as well")
        return value

    @property
    def alternatives(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


def check_prompt_bytes(text: str, most: int, where: str, ctx: int) -> None:
    """Refuse a text too long for the context before tokenizing it: no token holds more than
    the vocabulary's longest, so `most` bytes is what `ctx` tokens can hold at best."""
    if (size := len(text.encode())) > most:
        raise APIError(
            400,
            f"{where} is {size:,} bytes, more than {ctx:,} tokens of this tokenizer can hold "
            f"({most:,} bytes at most): shorten it",
            where.split()[0],
            "context_length_exceeded",
        )


def completion_prompts(
    prompts: list, tokenizer, vocab_size: int, most_bytes: int, ctx: int
) -> list:
    """Each prompt as token ids: strings checked in bytes, then encoded (with the tokenizer's
    special tokens); ids checked against the vocabulary."""
    out = []
    for n, prompt in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt {n}"
        if isinstance(prompt, str):
            check_prompt_bytes(prompt, most_bytes, where, ctx)
        ids = tokenizer.encode(prompt).ids if isinstance(prompt, str) else prompt
        if not ids:
            raise APIError(400, f"{where} is empty: give at least one token", "prompt")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise APIError(
                400,
                f"{where}: token id {bad[0]} is outside the vocabulary [0, {vocab_size})",
                "prompt",
            )
        out.append(ids)
    return out


def chat_prompt(messages: list, render, tokenizer, most_bytes: int, ctx: int) -> list:
    """The conversation through the model's chat template, up to the assistant's turn, as ids
    (the template writes the special tokens itself)."""
    turns = [
        {"role": "system" if m.role == "developer" else m.role, "content": m.content}
        for m in messages
    ]
    try:
        text = render(turns)
    except ChatTemplateError as exc:
        raise APIError(400, str(exc), "messages") from exc
    check_prompt_bytes(text, most_bytes, "messages", ctx)
    return tokenizer.encode(text, add_special_tokens=False).ids


class CompletionFormat:
    """OpenAI's text_completion objects: whole, or as stream chunks. `picked` is a choice's
    tokens with their log-probabilities, [(text, logprob, [(text, logprob) of the most likely
    ones])], or None when they were not asked for."""

    prefix, chunk_object = "cmpl", "text_completion"

    def __init__(self, meta: dict):
        self.meta = meta  # id, created, model
        self.offsets: dict = {}  # choice index -> characters of its text given logprobs so far

    def _chunk(self, choices: list, usage=None) -> dict:
        return dict(self.meta, object=self.chunk_object, choices=choices, usage=usage)

    def logprobs(self, index: int, picked) -> dict | None:
        """The legacy object: parallel lists, each token's top ones a dict (the token itself
        in it too, as OpenAI's), offsets in the completion's text."""
        if picked is None:
            return None
        offsets = list(
            accumulate((len(t) for t, _, _ in picked), initial=self.offsets.get(index, 0))
        )
        self.offsets[index] = offsets.pop()
        return {
            "tokens": [t for t, _, _ in picked],
            "token_logprobs": [p for _, p, _ in picked],
            "top_logprobs": [dict(top) | {t: p} for t, p, top in picked],
            "text_offset": offsets,
        }

    def opening(self) -> list:
        return []

    def chunks(self, index: int, text: str, reason, picked) -> list:
        if not text and reason is None and not picked:
            return []
        choice = {"index": index, "text": text, "logprobs": self.logprobs(index, picked)}
        return [self._chunk([dict(choice, finish_reason=reason)])]

    def usage_chunk(self, usage: dict) -> dict:
        return self._chunk([], usage)

    def whole(self, texts: list, reasons: list, usage: dict, picked: list) -> dict:
        choices = [
            {"index": i, "text": t, "logprobs": self.logprobs(i, p), "finish_reason": r}
            for i, (t, r, p) in enumerate(zip(texts, reasons, picked))
        ]
        return dict(self.meta, object="text_completion", choices=choices, usage=usage)


def _token(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


class ChatFormat(CompletionFormat):
    """OpenAI's chat.completion objects; a stream opens with the assistant's role and ends with
    an empty delta carrying the finish reason."""

    prefix, chunk_object = "chatcmpl", "chat.completion.chunk"

    def logprobs(self, index: int, picked) -> dict | None:
        if picked is None:
            return None
        content = [
            _token(t, p) | {"top_logprobs": [_token(*a) for a in top]} for t, p, top in picked
        ]
        return {"content": content, "refusal": None}

    def _delta(self, delta: dict, reason=None, logprobs=None) -> dict:
        return self._chunk(
            [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason}]
        )

    def opening(self) -> list:
        return [self._delta({"role": "assistant", "content": ""})]

    def chunks(self, index: int, text: str, reason, picked) -> list:
        delta = self._delta({"content": text}, logprobs=self.logprobs(0, picked))
        out = [delta] if text or picked else []
        return out + ([self._delta({}, reason)] if reason is not None else [])

    def whole(self, texts: list, reasons: list, usage: dict, picked: list) -> dict:
        message = {"role": "assistant", "content": texts[0]}
        choice = {"index": 0, "message": message, "logprobs": self.logprobs(0, picked[0])}
        choice["finish_reason"] = reasons[0]
        return dict(self.meta, object="chat.completion", choices=[choice], usage=usage)
