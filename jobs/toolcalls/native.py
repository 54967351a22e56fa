"""Models' own tool-call formats (the catalog's ``tool_call_format``) that
Ballast serves natively: how each writes its calls (``Layout``), the
constraint a host generates under (``constraint``: a ``json_sequence``
response format, or a plain ``json_schema`` when the format is one bare
JSON object), and the conversation rendered by the model's own chat
template, which takes the functions (``tools``) and earlier calls
(``tool_calls``, ``tool`` messages) itself (``prompt_rendered``).
``sequence.SequenceParser`` reads the answers. docs/tools.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from modeldata.template import ChatTemplate, ChatTemplateError

from ..errors import ApiError
from ..schemas import schema_checked
from .calls import call_schema, defs_hoisted
from .generic import Choice, Function


@dataclass(frozen=True)
class Layout:
    """How a format writes its calls: each ``prefix`` + ``{"name": ...,
    <arguments>: {...}}`` + ``suffix``, joined by ``separator``; ``parallel``:
    the template renders more than one call per answer."""

    prefix: str
    suffix: str
    separator: str
    arguments: str
    parallel: bool


LAYOUTS = {
    # Hermes 2 Pro/3, Qwen 2.5/3: <tool_call>\n{"name", "arguments"}\n</tool_call>
    "hermes": Layout("<tool_call>\n", "\n</tool_call>", "\n", "arguments", True),
    # Llama 3.1+: one bare {"name", "parameters"} object (the template
    # refuses an answer of more than one call)
    "llama3": Layout("", "", "", "parameters", False),
}
"""The catalog formats served natively; any other is served in the generic
JSON format (``generic``)."""


def constraint(functions: list[Function], choice: Choice, layout: Layout) -> dict:
    """The response format a host generates the answer under: calls of the
    functions ``choice`` allows (one when named or not parallel), or under
    ``auto`` any text that does not begin as a call does. A ``json_schema``
    when that is one bare JSON object, else a ``json_sequence``
    (docs/protocol-notes.md, 2026-12-07). Raises ApiError 400 (``tools``)
    when the schema is past ``jobs.schemas``' bounds."""
    defs: dict[str, Any] = {}
    members = [
        call_schema(
            f.name, defs_hoisted(f.parameters, f"f{i}_", defs), layout.arguments
        )
        for i, f in enumerate(functions)
        if choice.mode != "named" or f.name == choice.name
    ]
    schema: dict[str, Any] = members[0] if len(members) == 1 else {"anyOf": members}
    if defs:
        schema = {**schema, "$defs": defs}
    schema = schema_checked(schema, param="tools")
    single = choice.mode == "named" or not (choice.parallel and layout.parallel)
    if choice.mode != "auto" and single and not layout.prefix and not layout.suffix:
        return {
            "type": "json_schema",
            "json_schema": {"name": "tool_calls", "schema": schema, "strict": True},
        }
    spec: dict[str, Any] = {
        "name": "tool_calls",
        "schema": schema,
        "prefix": layout.prefix,
        "suffix": layout.suffix,
        "separator": layout.separator,
        "min_items": 1,
    }
    if single:
        spec["max_items"] = 1
    if choice.mode == "auto":
        spec["text_unless"] = layout.prefix or "{"
    return {"type": "json_sequence", "json_sequence": spec}


def tools_shown(functions: list[Function]) -> list[dict]:
    """The functions as a chat template takes them (``tools``): OpenAI's
    ``{"type": "function", "function": {"name", "description"?,
    "parameters"}}``, parameters as the renter wrote them."""
    shown = []
    for f in functions:
        spec: dict[str, Any] = {"name": f.name}
        if f.description:
            spec["description"] = f.description
        spec["parameters"] = f.shown_parameters
        shown.append({"type": "function", "function": spec})
    return shown


def _arguments(text: str) -> Any:
    """A call's ``arguments`` as a template prints them (``| tojson``): the
    JSON value, or the text when it is none ("" is no arguments)."""
    try:
        return json.loads(text or "{}")
    except ValueError:
        return text


def template_messages(messages: list[dict]) -> list[dict]:
    """Checked messages (``requests.message_tool_fields``) in the shape chat
    templates take: an assistant's ``tool_calls`` as ``[{"id", "type",
    "function": {"name", "arguments": <JSON value>}}]``, a ``tool`` message
    with its ``tool_call_id`` and the called function's ``name``."""
    names: dict[str, str] = {}
    out = []
    for message in messages:
        role, content = message["role"], message["content"]
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                if call["id"]:
                    names[call["id"]] = call["name"]
                calls.append(
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {
                            "name": call["name"],
                            "arguments": _arguments(call["arguments"]),
                        },
                    }
                )
            out.append({"role": "assistant", "content": content, "tool_calls": calls})
        elif role == "tool":
            call_id = message["tool_call_id"]
            item = {"role": "tool", "tool_call_id": call_id, "content": content}
            if call_id in names:
                item["name"] = names[call_id]
            out.append(item)
        else:
            out.append({"role": role, "content": content})
    return out


def prompt_rendered(
    template: ChatTemplate, messages: list[dict], functions: list[Function] | None
) -> str:
    """The prompt of a conversation as the model's own template renders it,
    with ``functions`` shown (None: not shown, ``tool_choice: "none"``),
    ending where the assistant's answer begins. Raises ApiError 400
    (``messages``) when the template refuses it (Llama 3.1's takes one call
    per assistant message and needs a user message to show functions in)."""
    try:
        return template.render(
            template_messages(messages),
            add_generation_prompt=True,
            tools=tools_shown(functions) if functions else None,
        )
    except ChatTemplateError as exc:
        raise ApiError(
            400,
            f"the model's chat template refuses this conversation: {exc}",
            "invalid_request",
            param="messages",
        ) from None
