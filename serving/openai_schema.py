"""The request bodies of the OpenAI-compatible API (pydantic, strict: "5" is not an int) and
their prompts as token ids, with OpenAI's error type for what is wrong with them. The fields
and defaults follow OpenAI's API reference; unknown fields are ignored."""

from __future__ import annotations

from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

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
    message = error["msg"].removeprefix("Value error, ")
    return APIError(400, f"{'.'.join(path)}: {message}", path[0])


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class SamplingBody(BaseModel):
    """What both endpoints take; temperature 0 is greedy."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)  # None: 1.0, as OpenAI
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)  # not OpenAI's: vLLM's extra field, 0 is off
    seed: int | None = Field(None, ge=SEEDS[0], le=SEEDS[1])
    stop: Any = Field(default_factory=list)  # a list of strings once validated
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value):
        if value is None or isinstance(value, str):
            return [] if value is None else [value]
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return value
        raise ValueError("must be a string or a list of strings")

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value):
        if value != 1:
            raise ValueError(f"only n=1 is supported, got {value}")
        return value

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionBody(SamplingBody):
    prompt: Any

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value):
        """A list of prompts, each a string or a list of token ids."""
        ids = lambda v: isinstance(v, list) and all(type(t) is int for t in v)  # (no bools)
        if isinstance(value, str) or (ids(value) and value):
            return [value]
        if isinstance(value, list) and value and all(isinstance(v, str) or ids(v) for v in value):
            return value
        raise ValueError(
            "must be a string, a list of strings, a list of token ids or a list of those lists"
        )


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: Any

    @field_validator("content")
    @classmethod
    def _text(cls, value):
        """A string, or OpenAI's list of text parts joined."""
        if isinstance(value, str):
            return value
        parts = value if isinstance(value, list) else [None]
        if all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
            if all(isinstance(p.get("text"), str) for p in parts):
                return "".join(p["text"] for p in parts)
        raise ValueError('must be a string or a list of {"type": "text", "text": ...} parts')


class ChatBody(SamplingBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name of max_tokens

    def model_post_init(self, context) -> None:
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens


def completion_prompts(prompts: list, tokenizer, vocab_size: int) -> list:
    """Each prompt as token ids: strings encoded (with the tokenizer's special tokens), ids
    checked against the vocabulary."""
    out = []
    for n, prompt in enumerate(prompts):
        ids = tokenizer.encode(prompt).ids if isinstance(prompt, str) else prompt
        where = "prompt" if len(prompts) == 1 else f"prompt {n}"
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


def chat_prompt(messages: list, render, tokenizer) -> list:
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
    return tokenizer.encode(text, add_special_tokens=False).ids


class CompletionFormat:
    """OpenAI's text_completion objects: whole, or as stream chunks."""

    prefix, chunk_object = "cmpl", "text_completion"

    def __init__(self, meta: dict):
        self.meta = meta  # id, created, model

    def _chunk(self, choices: list, usage=None) -> dict:
        return dict(self.meta, object=self.chunk_object, choices=choices, usage=usage)

    def opening(self) -> list:
        return []

    def chunks(self, index: int, text: str, reason) -> list:
        if not text and reason is None:
            return []
        return [
            self._chunk([{"index": index, "text": text, "logprobs": None, "finish_reason": reason}])
        ]

    def usage_chunk(self, usage: dict) -> dict:
        return self._chunk([], usage)

    def whole(self, texts: list, reasons: list, usage: dict) -> dict:
        choices = [
            {"index": i, "text": t, "logprobs": None, "finish_reason": r}
            for i, (t, r) in enumerate(zip(texts, reasons))
        ]
        return dict(self.meta, object="text_completion", choices=choices, usage=usage)


class ChatFormat(CompletionFormat):
    """OpenAI's chat.completion objects; a stream opens with the assistant's role and ends with
    an empty delta carrying the finish reason."""

    prefix, chunk_object = "chatcmpl", "chat.completion.chunk"

    def _delta(self, delta: dict, reason=None) -> dict:
        return self._chunk(
            [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]
        )

    def opening(self) -> list:
        return [self._delta({"role": "assistant", "content": ""})]

    def chunks(self, index: int, text: str, reason) -> list:
        out = [self._delta({"content": text})] if text else []
        return out + ([self._delta({}, reason)] if reason is not None else [])

    def whole(self, texts: list, reasons: list, usage: dict) -> dict:
        message = {"role": "assistant", "content": texts[0]}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reasons[0]}
        return dict(self.meta, object="chat.completion", choices=[choice], usage=usage)
