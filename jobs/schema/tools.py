"""The OpenAPI pieces of function calling (``jobs.toolcalls``): the request's
``tools``, ``tool_choice``, ``parallel_tool_calls`` and messages' tool fields,
and the answers' ``tool_calls`` (whole and streamed), with the bounds of
``jobs.toolcalls.requests``."""

from __future__ import annotations

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers

from ..toolcalls import requests as rules

_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}


def request_properties(text: dict) -> dict:
    """The request body's function-calling fields (chat only); ``text``: the
    schema of a storable string (``completion_requests._text``)."""
    function = {
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "properties": {
            "name": _NAME,
            "description": {
                **text,
                "maxLength": rules.DESCRIPTION_MAX_CHARS,
                "nullable": True,
            },
            "parameters": {
                "type": "object",
                "required": ["type"],
                "additionalProperties": False,
                "properties": {"type": {"type": "string", "enum": ["object"]}},
                "description": "JSON Schema of the arguments, of type object. This "
                "schema shows the simplest; the subset enforced is response_format "
                'json_schema\'s (docs/protocol-notes.md "Output features"; any other '
                "keyword is a 400 naming its path)",
            },
            "strict": {"type": "boolean", "nullable": True},
        },
    }
    tool = {
        "type": "object",
        "required": ["type", "function"],
        "additionalProperties": False,
        "properties": {
            "type": {"type": "string", "enum": ["function"]},
            "function": function,
        },
    }
    named = {
        "type": "object",
        "required": ["type", "function"],
        "properties": {
            "type": {"type": "string", "enum": ["function"]},
            "function": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": _NAME},
            },
        },
    }
    return {
        "tools": {
            "type": "array",
            "maxItems": rules.MAX_TOOLS,
            "items": tool,
            "nullable": True,
            "description": "functions the model may call (docs/tools.md); answers "
            "are generated under a constraint, so only devices that declare "
            "json_schema serve them",
        },
        "tool_choice": {
            "nullable": True,
            "description": "default auto; required or a named function needs "
            "tools (a name among them)",
            "anyOf": [{"type": "string", "enum": list(rules.CHOICES)}, named],
        },
        "parallel_tool_calls": {
            "type": "boolean",
            "nullable": True,
            "description": "false: at most one call per answer",
        },
    }


def message_schema(content: dict, roles: list[str], text: dict) -> dict:
    """A chat message (``content``: the schema of its content; ``text``: of a
    storable string): any role but ``tool`` with its content; a tool message
    with the ``tool_call_id`` of the call it answers (an earlier assistant
    message's: no schema relates two messages, the 400 names it); or an
    assistant's ``tool_calls``, its content then null or absent too."""
    said = {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"type": "string", "enum": [r for r in roles if r != "tool"]},
            "content": content,
            "tool_calls": {
                "type": "array",
                "maxItems": 0,
                "nullable": True,
                "description": "an assistant's only",
            },
        },
    }
    answered = {
        "type": "object",
        "required": ["role", "content", "tool_call_id"],
        "properties": {
            "role": {"type": "string", "enum": ["tool"]},
            "content": content,
            "tool_call_id": {
                **text,
                "minLength": 1,
                "description": "the id of the call it answers, among an earlier "
                "assistant message's tool_calls",
            },
        },
    }
    called = {
        "type": "object",
        "required": ["role", "tool_calls"],
        "properties": {
            "role": {"type": "string", "enum": ["assistant"]},
            "content": {**content, "nullable": True},
            "tool_calls": {**_calls(text), "minItems": 1},
        },
    }
    return {"anyOf": [said, answered, called]}


def _calls(text: dict) -> dict:
    """An assistant's earlier ``tool_calls``."""
    call = {
        "type": "object",
        "required": ["function"],
        "properties": {
            "id": text,
            "type": {"type": "string", "enum": ["function"]},
            "function": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {**text, "minLength": 1},
                    "arguments": {
                        **text,
                        "description": "JSON text (a 400 names text that is not)",
                    },
                },
            },
        },
    }
    return {"type": "array", "items": call}


def _call(name: str, *, streamed: bool) -> serializers.Serializer:
    optional = {"required": False} if streamed else {}
    return inline_serializer(
        name,
        {
            **({"index": serializers.IntegerField()} if streamed else {}),
            "id": serializers.CharField(**optional, help_text="call_…"),
            # a CharField: a ChoiceField's enum would clash with other "type" enums
            "type": serializers.CharField(**optional, help_text="function"),
            "function": inline_serializer(
                f"{name}Function",
                {
                    "name": serializers.CharField(**optional),
                    "arguments": serializers.CharField(
                        help_text="JSON text; streamed in pieces, in order"
                    ),
                },
            ),
        },
        many=True,
        required=False,
        help_text="a call's first streamed piece has id, type and name"
        if streamed
        else "when the model called (finish_reason tool_calls)",
    )


TOOL_CALLS = _call("ChatCompletionToolCall", streamed=False)
TOOL_CALL_DELTAS = _call("ChatCompletionToolCallDelta", streamed=True)


# the request's rule the schema can state: required or a named function only
# with tools (an allOf member of the request body)
CHOICE_NEEDS_TOOLS = {
    "anyOf": [
        {
            "required": ["tools"],
            "properties": {"tools": {"type": "array", "minItems": 1}},
        },
        {"properties": {"tool_choice": {"enum": [None, "none", "auto"]}}},
    ]
}


def _without_tools_or_a_choice() -> list[dict]:
    """The ways a request asks no tool call: no tools, or tool_choice none."""
    return [
        {"properties": {"tools": {"enum": [None, []]}}},
        {
            "required": ["tool_choice"],
            "properties": {"tool_choice": {"enum": ["none"]}},
        },
    ]


# what cannot go with a tool call (jobs.requests: one constraint per answer;
# no logprobs): allOf members of the request body
TOOLS_EXCLUDE = [
    {
        "anyOf": [
            *_without_tools_or_a_choice(),
            {"properties": {"logprobs": {"enum": [None, False]}}},
        ]
    },
    {
        "anyOf": [
            *_without_tools_or_a_choice(),
            {
                "properties": {
                    "response_format": {
                        "anyOf": [
                            {"enum": [None]},
                            {
                                "type": "object",
                                "properties": {"type": {"enum": ["text"]}},
                            },
                        ]
                    }
                }
            },
        ]
    },
]
