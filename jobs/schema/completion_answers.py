"""The OpenAPI components of a completion's answers: the whole answer
(``stream: false``) and the chunks of a stream of server-sent events
(``stream: true``), as ``jobs.chunks.ChunkWriter`` writes them.
"""

from __future__ import annotations

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers

from . import ERROR_OBJECT
from .tools import TOOL_CALL_DELTAS, TOOL_CALLS

FINISH_REASONS = ("stop", "length", "error", "tool_calls")
# the ``object`` of each answer (``jobs.chunks.ChunkWriter``), named for
# ENUM_NAME_OVERRIDES (settings): the enums of four components share a field name
CHAT_OBJECT = ["chat.completion"]
CHAT_CHUNK_OBJECT = ["chat.completion.chunk"]
TEXT_OBJECT = ["text_completion"]

USAGE_TOKENS = inline_serializer(
    "CompletionUsage",
    {
        "prompt_tokens": serializers.IntegerField(),
        "completion_tokens": serializers.IntegerField(),
        "total_tokens": serializers.IntegerField(),
    },
)
_AFTER_OUTPUT = "a failure after output (finish_reason `error`)"


def _answer(
    name: str, kind: list[str], choice: dict, *, chunk: bool
) -> serializers.Serializer:
    """The component ``name`` of an answer whose ``object`` is one of ``kind`` and
    whose choices carry the fields ``choice`` (``message`` or ``delta``, or
    ``text``). ``chunk``: one chunk of a stream, whose ``finish_reason`` is null
    until the last, whose choices are empty in the usage chunk and whose
    ``usage`` only that chunk carries; otherwise the whole answer. (DRF orders a
    serializer's fields as they were made: each is made in its place.)"""
    return inline_serializer(
        name,
        {
            "id": serializers.CharField(),
            "object": serializers.ChoiceField(choices=kind),
            "created": serializers.IntegerField(help_text="unix s"),
            "model": serializers.CharField(),
            "choices": inline_serializer(
                f"{name}Choice",
                {
                    "index": serializers.IntegerField(),
                    **choice,
                    "finish_reason": serializers.ChoiceField(
                        choices=FINISH_REASONS, allow_null=chunk
                    ),
                    "logprobs": serializers.DictField(allow_null=True),
                },
                many=True,
                help_text="empty in the usage chunk" if chunk else None,
            ),
            "usage": USAGE_TOKENS.__class__(
                required=False, help_text="stream_options.include_usage: the last chunk"
            )
            if chunk
            else USAGE_TOKENS,
            "error": ERROR_OBJECT.__class__(required=False, help_text=_AFTER_OUTPUT),
        },
    )


CHAT_COMPLETION = _answer(
    "ChatCompletion",
    CHAT_OBJECT,
    {
        "message": inline_serializer(
            "ChatCompletionMessage",
            {
                "role": serializers.ChoiceField(choices=["assistant"]),
                "content": serializers.CharField(
                    allow_null=True, help_text="null when the model only called"
                ),
                "tool_calls": TOOL_CALLS,
            },
        )
    },
    chunk=False,
)
TEXT_COMPLETION = _answer(
    "TextCompletion", TEXT_OBJECT, {"text": serializers.CharField()}, chunk=False
)
CHAT_CHUNK = _answer(
    "ChatCompletionChunk",
    CHAT_CHUNK_OBJECT,
    {
        "delta": inline_serializer(
            "ChatCompletionDelta",
            {
                "role": serializers.ChoiceField(choices=["assistant"], required=False),
                "content": serializers.CharField(required=False),
                "tool_calls": TOOL_CALL_DELTAS,
            },
        )
    },
    chunk=True,
)
TEXT_CHUNK = _answer(
    "TextCompletionChunk", TEXT_OBJECT, {"text": serializers.CharField()}, chunk=True
)


def events_schema(chunk_ref: str) -> dict:
    """The schema of one server-sent event of a stream of ``chunk_ref``'s chunks
    (OpenAPI 3.0: the media type's schema describes each event; 3.0 has no
    keyword for JSON inside a string, so the chunk is named, not nested)."""
    chunk = chunk_ref.rsplit("/", 1)[-1]
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {
                "type": "string",
                "description": f"a {chunk} as JSON ({chunk_ref}), `[DONE]` last",
            },
        },
    }
