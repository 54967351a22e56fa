"""Rendering the model's chat template, then the prefix to continue from."""

from __future__ import annotations

import pytest

from agent.engines.chat_template import ChatTemplate, ChatTemplateError, prompt_build
from agent.engines.gguf import gguf_chat_template
from agent.engines.llamacpp import smollm2_gguf_path

pytestmark = []


@pytest.fixture(scope="module")
def smollm2() -> ChatTemplate:
    path = smollm2_gguf_path()
    assert path is not None
    source, bos, eos = gguf_chat_template(path)
    return ChatTemplate(source, bos_token=bos, eos_token=eos)


def test_it_opens_the_assistant_turn_then_appends_the_prefix(smollm2) -> None:
    prompt = prompt_build(smollm2, [{"role": "user", "content": "Hi"}], None, "Hel")
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHel")


def test_it_joins_openai_content_parts(smollm2) -> None:
    parts = [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]
    prompt = prompt_build(smollm2, [{"role": "user", "content": parts}], None, "")
    assert "<|im_start|>user\nHi there<|im_end|>" in prompt


def test_a_raw_prompt_is_used_as_is() -> None:
    assert prompt_build(None, None, "The sky is", " bl") == "The sky is bl"


def test_template_errors_are_chat_template_errors() -> None:
    template = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="alternate"):
        template.render([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{% for %}")
    with pytest.raises(ChatTemplateError):
        prompt_build(None, [{"role": "user", "content": "x"}], None, "")
