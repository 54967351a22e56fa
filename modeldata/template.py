"""Render a model's own chat template (Jinja, as stored in GGUF metadata).

The agent's engines render the conversation themselves and then send a raw
completion, so that ``continue_from`` can be appended verbatim after the
assistant's turn opens and the model continues exactly from there (mid-word
too); the coordinator renders it the same way to count a prompt's tokens.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from modeldata.modelfile import VocabData

TEMPLATE_KEY = "tokenizer.chat_template"
"""GGUF metadata key holding the Jinja chat template."""


class ChatTemplateError(Exception):
    """The template is missing, does not compile, or fails on these messages."""


class ChatTemplate:
    """A compiled Jinja chat template.

    ``bos_token`` / ``eos_token`` are the model's special tokens as text (some
    templates print them). Rendering is sandboxed (``ImmutableSandboxedEnvironment``).
    """

    def __init__(
        self, source: str, *, bos_token: str = "", eos_token: str = ""
    ) -> None:
        if not source:
            raise ChatTemplateError("the model has no chat template")
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=["jinja2.ext.loopcontrols"],
        )
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
        self.bos_token = bos_token
        self.eos_token = eos_token

    @classmethod
    def from_vocab(cls, data: VocabData) -> ChatTemplate:
        """The template of a model's ``VocabData``, its BOS and EOS tokens' text
        taken from the file's ``bos_token_id`` / ``eos_token_id`` ("" without).

        Raises ``ChatTemplateError`` when the model has no template or it does
        not compile.
        """
        return cls(
            data.chat_template,
            bos_token=data.token_text(data.bos_id),
            eos_token=data.token_text(data.eos_id),
        )

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """Return the prompt text for ``messages`` (OpenAI chat shape, an
        assistant's ``tool_calls`` and ``tool`` messages included), with
        ``tools`` (OpenAI's function list) for a template that shows them.

        With ``add_generation_prompt`` the text ends where the assistant's answer
        begins. Raises ``ChatTemplateError`` when the template rejects the input.
        """
        try:
            return self._template.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except (jinja2.TemplateError, TypeError, ValueError) as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc


def message_flatten(message: dict[str, Any]) -> dict[str, Any]:
    """Join OpenAI content parts (``[{"type": "text", "text": ...}]``) into one
    string, which is what text-only chat templates expect."""
    content = message.get("content")
    if isinstance(content, list):
        texts = [
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        ]
        return {**message, "content": "".join(texts)}
    return message


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """Templates' ``tojson`` as Hugging Face's and llama.cpp's renderers
    define it (keys in order, no HTML escapes), not Jinja's."""
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
    )


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def prompt_build(
    template: ChatTemplate | None,
    messages: list[dict[str, Any]] | None,
    prompt: str | None,
    continue_from: str,
) -> str:
    """The raw completion prompt of a request: rendered chat (or raw prompt)
    followed by ``continue_from`` verbatim.

    Raises ``ChatTemplateError`` for chat messages when there is no template.
    """
    if messages is not None:
        if template is None:
            raise ChatTemplateError("no chat template to render these messages")
        head = template.render(
            [message_flatten(m) for m in messages], add_generation_prompt=True
        )
    else:
        head = prompt or ""
    return head + (continue_from or "")
