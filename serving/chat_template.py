"""A model folder's chat template (`chat_template` of tokenizer_config.json) rendered for a
conversation with jinja2, as Hugging Face renders it: sandboxed, `trim_blocks` and
`lstrip_blocks`, the `loopcontrols` extension, `raise_exception`, and the generation prompt
appended."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


class ChatTemplateError(ValueError):
    """No template, no jinja2, or a template that fails; the message names the fix."""


def _token_text(value) -> str:
    return value.get("content", "") if isinstance(value, dict) else (value or "")


def chat_template(model: Path) -> tuple:
    """(template text, tokenizer_config dict) of the folder."""
    path = Path(model) / "tokenizer_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ChatTemplateError(f"--chat needs {path} with a chat_template ({exc})") from exc
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if not isinstance(template, str):
        raise ChatTemplateError(f"{path} has no chat_template: leave out --chat")
    return template, config


def chat_renderer(model: Path) -> Callable[[list], str]:
    """`render(messages)`: the text the model sees for a conversation (dicts of role and
    content), up to the assistant's next turn. The template is read and compiled once."""
    template, config = chat_template(model)
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as exc:
        raise ChatTemplateError('--chat needs jinja2: pip install -e ".[models]"') from exc

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = raise_exception
    try:
        compiled = env.from_string(template)
    except TemplateError as exc:
        raise ChatTemplateError(f"the chat template of {model} failed: {exc}") from exc
    tokens = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token")}

    def render(messages: list) -> str:
        try:
            return compiled.render(messages=messages, add_generation_prompt=True, **tokens)
        except TemplateError as exc:
            raise ChatTemplateError(f"the chat template of {model} failed: {exc}") from exc

    return render


def render_chat(model: Path, prompt: str) -> str:
    """The text the model sees for `prompt` as the user's message, up to the assistant's turn."""
    return chat_renderer(model)([{"role": "user", "content": prompt}])
