"""The chat template rendered as transformers renders it, and its errors by name."""

import json
import sys

import pytest

from serving.chat_template import ChatTemplateError, chat_renderer, render_chat


def test_smollm2_template_renders_as_transformers(smollm2_dir):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    for prompt in ("Hi!", "Grüß dich {{ not jinja }}\n<b>"):
        messages = [{"role": "user", "content": prompt}]
        theirs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert render_chat(smollm2_dir, prompt) == theirs
    assert render_chat(smollm2_dir, "Hi!").endswith("<|im_end|>\n<|im_start|>assistant\n")
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Capital of France?"},
    ]
    theirs = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    assert chat_renderer(smollm2_dir)(conversation) == theirs


def write_config(folder, **config):
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_bos_token_and_loop_controls(tmp_path):
    template = (
        "{% for m in messages %}{% if m.role == 'x' %}{% continue %}{% endif %}"
        "{{ bos_token }}{{ m.content }}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    )
    folder = write_config(tmp_path, chat_template=template, bos_token={"content": "<s>"})
    assert render_chat(folder, "q") == "<s>q>"


def test_errors_name_the_fix(tmp_path, monkeypatch):
    with pytest.raises(ChatTemplateError, match=r"--chat needs .*tokenizer_config.json with a"):
        render_chat(tmp_path, "q")
    write_config(tmp_path, bos_token="<s>")
    with pytest.raises(ChatTemplateError, match=r"has no chat_template: leave out --chat"):
        render_chat(tmp_path, "q")
    write_config(tmp_path, chat_template="{{ raise_exception('only system turns') }}")
    with pytest.raises(ChatTemplateError, match=r"chat template of .* failed: only system turns"):
        render_chat(tmp_path, "q")
    monkeypatch.setitem(sys.modules, "jinja2", None)
    with pytest.raises(ChatTemplateError, match=r'--chat needs jinja2: pip install -e "\.\[models'):
        render_chat(tmp_path, "q")
