"""The JSON Schema of a completions request body (``POST /v1/chat/completions``,
``/v1/completions``), as ``jobs.requests.completion_request_parse`` checks it: its
bounds are read from the same constants (``jobs.requests``, ``jobs.formats``).

``model`` is an enum of the catalog's active models when the schema is made (a
request naming another is a 404); the prompt plus ``max_tokens`` fitting the
model's context is a rule the schema cannot state (``400
context_length_exceeded``).
"""

from __future__ import annotations

from typing import Any

from hosts.regions import region_codes

from .. import formats
from .. import requests as rules
from . import tools

# ``requests._text``: no NUL (valid UTF-8 is JSON's own rule)
TEXT_PATTERN = "^[^\\x00]*$"


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
    properties["region"] = {
        "type": "string",
        "enum": region_codes(),
        "nullable": True,
        "description": "one of the regions machines may be in (hosts.regions)",
    }
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
        message = tools.message_schema(_content_schema(), sorted(rules.ROLES), _text())
        properties.update(tools.request_properties(_text()))
        properties["messages"] = {"type": "array", "minItems": 1, "items": message}
        required = ["model", "messages"]
    else:
        properties["tools"] = _neutral((None, []))  # chat only
        properties["tool_choice"] = _neutral((None, "none"))
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
            *([tools.CHOICE_NEEDS_TOOLS, *tools.TOOLS_EXCLUDE] if endpoint == "chat" else []),
        ],
    }
