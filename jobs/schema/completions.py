"""The OpenAPI description of ``POST /v1/chat/completions`` and ``/v1/completions``.

They are plain async Django views (``jobs.views``), which drf-spectacular does not
enumerate, so ``completions_endpoints`` (a ``PREPROCESSING_HOOKS`` entry) adds a
documentation twin of each, a DRF view that only carries the ``extend_schema``:
the request body as ``jobs.requests.completion_request_parse`` checks it (its
bounds read from the same constants), the answers (a JSON object, or server-sent
events with ``stream: true``) and every error status the views answer.

``model`` is an enum of the catalog's active models when the schema is made (a
request naming another is a 404); the prompt plus ``max_tokens`` fitting the
model's context is a rule the schema cannot state (``400
context_length_exceeded``).
"""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers
from rest_framework.views import APIView

from .. import formats
from .. import requests as rules
from . import ERROR_OBJECT, RETRY_AFTER, errors

# ``requests._text``: no NUL (valid UTF-8 is JSON's own rule)
TEXT_PATTERN = "^[^\\x00]*$"
FINISH_REASONS = ("stop", "length", "error")
# the ``object`` of each answer (``jobs.chunks.ChunkWriter``), named for
# ENUM_NAME_OVERRIDES (settings): the enums of four components share a field name
CHAT_OBJECT = ["chat.completion"]
CHAT_CHUNK_OBJECT = ["chat.completion.chunk"]
TEXT_OBJECT = ["text_completion"]


def _text(**bounds: Any) -> dict:
    return {"type": "string", "pattern": TEXT_PATTERN, **bounds}


def _nullable(schema: dict) -> dict:
    return {**schema, "nullable": True}


def _neutral(values: tuple) -> dict:
    """A field Ballast cannot honour: only the values that ask for nothing
    (``requests.UNSUPPORTED``)."""
    return {
        "enum": list(values),
        "description": "not supported: only these values, which ask for nothing",
    }


def _content_schema() -> dict:
    part = {
        "type": "object",
        "required": ["type", "text"],
        "properties": {
            "type": {"type": "string", "enum": ["text"]},
            "text": _text(),
        },
    }
    return {"anyOf": [_text(), {"type": "array", "items": part}]}


def _placement_schema() -> dict:
    text = _nullable(_text(minLength=1, maxLength=rules.PLACEMENT_TEXT_MAX_CHARS))
    properties = {name: text for name in rules.PLACEMENT_TEXT_FIELDS}
    properties["min_vram_gb"] = {
        "type": "number",
        "minimum": 0,
        "maximum": rules.MIN_VRAM_GB_MAX,
        "nullable": True,
    }
    properties["rental"] = {**text, "description": "a live rental of yours (its id)"}
    return {
        "type": "object",
        "nullable": True,
        "additionalProperties": False,
        "properties": properties,
        "description": "where the request may run (all optional)",
    }


def request_schema(endpoint: str, model_ids: list[str]) -> dict:
    """The JSON Schema (OpenAPI 3.0) of a request body to ``endpoint`` (``chat``
    or ``completion``, ``jobs.models.Job.Endpoint``) naming one of ``model_ids``."""
    model = _text(minLength=1, maxLength=rules.MODEL_ID_MAX_CHARS)
    if model_ids:
        model["enum"] = model_ids
    max_tokens = {
        "type": "integer",
        "minimum": 1,
        "maximum": rules.MAX_MAX_TOKENS,
        "nullable": True,
        "description": f"default {rules.DEFAULT_MAX_TOKENS}; the prompt plus "
        "max_tokens must fit the model's context_length (/v1/models)",
    }
    stop = _text(minLength=1)
    properties: dict[str, Any] = {
        "model": model,
        "n": {"type": "integer", "minimum": 1, "maximum": 1, "nullable": True},
        "max_tokens": max_tokens,
        "max_completion_tokens": {**max_tokens, "description": "as max_tokens"},
        "temperature": {
            "type": "number",
            "minimum": rules.TEMPERATURE_RANGE[0],
            "maximum": rules.TEMPERATURE_RANGE[1],
            "nullable": True,
        },
        "top_p": {
            "type": "number",
            "minimum": rules.TOP_P_RANGE[0],
            "maximum": rules.TOP_P_RANGE[1],
            "nullable": True,
        },
        "stop": {
            "anyOf": [
                _nullable(stop),
                {"type": "array", "maxItems": rules.STOP_MAX, "items": stop},
            ]
        },
        "seed": {
            "type": "integer",
            "format": "int64",
            "minimum": rules.SEED_RANGE[0],
            "maximum": rules.SEED_RANGE[1],
            "nullable": True,
        },
        "stream": {"type": "boolean", "default": False},
        "stream_options": {
            "type": "object",
            "nullable": True,
            "properties": {"include_usage": {"type": "boolean"}},
            "description": "only with stream: true",
        },
        "placement": _placement_schema(),
        **{name: _neutral(values) for name, values in rules.UNSUPPORTED.items()},
    }
    top = {"type": "integer", "minimum": 0, "maximum": formats.MAX_TOP_LOGPROBS}
    if endpoint == "chat":
        properties["logprobs"] = {
            "type": "boolean",
            "nullable": True,
            "description": "each token's log-probability in the answer",
        }
        properties["top_logprobs"] = {
            **top,
            "nullable": True,
            "description": "alternatives per token (needs logprobs: true)",
        }
        kinds = [
            {"type": "string", "enum": [kind]} for kind in ("text", "json_object")
        ]
        properties["response_format"] = {
            "nullable": True,
            "description": "constrained decoding: the answer parses as JSON "
            "(json_object) or against the schema (json_schema). This schema shows "
            "the simplest json_schema; the subset llama.cpp's grammar enforces is "
            'in docs/protocol-notes.md "Output features" (any other keyword is a '
            "400 naming its path)",
            "oneOf": [
                *(
                    {
                        "type": "object",
                        "required": ["type"],
                        "additionalProperties": False,
                        "properties": {"type": kind},
                    }
                    for kind in kinds
                ),
                {
                    "type": "object",
                    "required": ["type", "json_schema"],
                    "additionalProperties": False,
                    "properties": {
                        "type": {"type": "string", "enum": ["json_schema"]},
                        "json_schema": {
                            "type": "object",
                            "required": ["name", "schema"],
                            "additionalProperties": False,
                            "properties": {
                                "name": {
                                    "type": "string",
                                    "pattern": "^[A-Za-z0-9_-]{1,64}$",
                                },
                                "schema": {
                                    "type": "object",
                                    "required": ["type"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "type": {
                                            "type": "string",
                                            "enum": [
                                                "object",
                                                "string",
                                                "number",
                                                "integer",
                                                "boolean",
                                                "null",
                                            ],
                                        }
                                    },
                                },
                                "strict": {"type": "boolean"},
                            },
                        },
                    },
                },
            ],
        }
        message = {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"type": "string", "enum": sorted(rules.ROLES)},
                "content": _content_schema(),
            },
        }
        properties["messages"] = {"type": "array", "minItems": 1, "items": message}
        required = ["model", "messages"]
    else:
        properties["logprobs"] = {
            "anyOf": [
                {**top, "nullable": True},
                {"type": "boolean", "enum": [False]},
            ],
            "description": "each token's log-probability and this many "
            "alternatives (false or null: none)",
        }
        prompt = _text(minLength=1)
        properties["prompt"] = {
            "anyOf": [
                prompt,
                {"type": "array", "minItems": 1, "maxItems": 1, "items": prompt},
            ]
        }
        required = ["model", "prompt"]
    return {
        "type": "object",
        "required": required,
        "properties": properties,
        "allOf": [
            # stream_options only with stream: true (as OpenAI answers it)
            {
                "anyOf": [
                    {"required": ["stream"], "properties": {"stream": {"enum": [True]}}},
                    {"properties": {"stream_options": {"enum": [None]}}},
                ]
            },
            *(
                # chat: top_logprobs (but 0) only with logprobs: true
                [
                    {
                        "anyOf": [
                            {
                                "required": ["logprobs"],
                                "properties": {"logprobs": {"enum": [True]}},
                            },
                            {"properties": {"top_logprobs": {"enum": [None, 0]}}},
                        ]
                    }
                ]
                if endpoint == "chat"
                else []
            ),
        ],
    }


# --- answers -------------------------------------------------------------------------
USAGE_TOKENS = inline_serializer(
    "CompletionUsage",
    {
        "prompt_tokens": serializers.IntegerField(),
        "completion_tokens": serializers.IntegerField(),
        "total_tokens": serializers.IntegerField(),
    },
)
_AFTER_OUTPUT = "a failure after output (finish_reason `error`)"


def _completion(name: str, kind: list[str], choice: dict) -> serializers.Serializer:
    choice_fields = {
        "index": serializers.IntegerField(),
        **choice,
        "finish_reason": serializers.ChoiceField(choices=FINISH_REASONS),
        "logprobs": serializers.DictField(allow_null=True),
    }
    return inline_serializer(
        name,
        {
            "id": serializers.CharField(),
            "object": serializers.ChoiceField(choices=kind),
            "created": serializers.IntegerField(help_text="unix s"),
            "model": serializers.CharField(),
            "choices": inline_serializer(f"{name}Choice", choice_fields, many=True),
            "usage": USAGE_TOKENS,
            "error": ERROR_OBJECT.__class__(required=False, help_text=_AFTER_OUTPUT),
        },
    )


CHAT_COMPLETION = _completion(
    "ChatCompletion",
    CHAT_OBJECT,
    {
        "message": inline_serializer(
            "ChatCompletionMessage",
            {
                "role": serializers.ChoiceField(choices=["assistant"]),
                "content": serializers.CharField(),
            },
        )
    },
)
TEXT_COMPLETION = _completion(
    "TextCompletion", TEXT_OBJECT, {"text": serializers.CharField()}
)


def _chunk(name: str, kind: list[str], choice: dict) -> serializers.Serializer:
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
                        choices=FINISH_REASONS, allow_null=True
                    ),
                    "logprobs": serializers.DictField(allow_null=True),
                },
                many=True,
                help_text="empty in the usage chunk",
            ),
            "usage": USAGE_TOKENS.__class__(
                required=False, help_text="stream_options.include_usage: the last chunk"
            ),
            "error": ERROR_OBJECT.__class__(required=False, help_text=_AFTER_OUTPUT),
        },
    )


CHAT_CHUNK = _chunk(
    "ChatCompletionChunk",
    CHAT_CHUNK_OBJECT,
    {
        "delta": inline_serializer(
            "ChatCompletionDelta",
            {
                "role": serializers.ChoiceField(choices=["assistant"], required=False),
                "content": serializers.CharField(required=False),
            },
        )
    },
)
TEXT_CHUNK = _chunk(
    "TextCompletionChunk", TEXT_OBJECT, {"text": serializers.CharField()}
)


def _events(chunk_ref: str) -> dict:
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


JOB_ID = OpenApiParameter(
    "x-ballast-job-id",
    OpenApiTypes.UUID,
    OpenApiParameter.HEADER,
    response=[200, 502, 503, 504],
    description="the job (`GET /v1/jobs/{id}`)",
)
_ANSWERS = (
    "stream: false (the default): the whole answer; stream: true: server-sent "
    "events, `data: {chunk}` … `data: [DONE]`, where a failure after output ends "
    "with a chunk whose finish_reason is `error` and that carries an `error` object"
)


class CompletionsSchema(AutoSchema):
    """drf-spectacular's AutoSchema for a documentation twin (``view.chunk``: its
    streamed chunk's serializer): the request body is required and the 200 is
    also a stream of server-sent events, each described with its chunk."""

    def _get_request_body(self, direction="request"):
        body = super()._get_request_body(direction)
        body["required"] = True
        return body

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        chunk = self.resolve_serializer(self.view.chunk, direction).ref["$ref"]
        responses["200"]["content"]["text/event-stream"] = {"schema": _events(chunk)}
        return responses


def _doc_view(endpoint: str, answer, chunk, model_ids: list[str]) -> type:
    """A DRF view that only documents a completions endpoint."""

    class CompletionsDoc(APIView):
        schema = CompletionsSchema()

        @extend_schema(
            request={"application/json": request_schema(endpoint, model_ids)},
            parameters=[JOB_ID, RETRY_AFTER],
            responses={
                200: OpenApiResponse(answer, description=_ANSWERS),
                **errors(
                    400,
                    402,
                    404,
                    409,
                    413,
                    429,
                    502,
                    504,
                    s404="model not in the catalog, or placement.rental not yours",
                    s409="placement.rental is not live",
                ),
            },
        )
        def post(self, request):
            raise NotImplementedError("documentation only: jobs.views serves it")

    CompletionsDoc.chunk = chunk
    CompletionsDoc.__name__ = f"{endpoint.title()}CompletionsDoc"
    return CompletionsDoc


def completions_endpoints(endpoints: list[tuple]) -> list[tuple]:
    """drf-spectacular preprocessing hook: ``endpoints`` (path, path_regex,
    method, callback) plus the two completions endpoints, described by their
    documentation twins, made now (the catalog's models as they are now; any
    model name when the database cannot be read, as ``manage.py check`` before
    the database is reachable)."""
    from django.db import DatabaseError

    from catalog.models import CatalogModel

    try:
        model_ids = sorted(
            CatalogModel.objects.filter(active=True).values_list("id", flat=True)
        )
    except DatabaseError:
        model_ids = []
    added = []
    for name, endpoint, answer, chunk in (
        ("chat-completions", "chat", CHAT_COMPLETION, CHAT_CHUNK),
        ("completions", "completion", TEXT_COMPLETION, TEXT_CHUNK),
    ):
        path = reverse(name)
        view = _doc_view(endpoint, answer, chunk, model_ids)
        added.append((path, f"^{path[1:]}$", "POST", view.as_view()))
    return [*endpoints, *added]
