"""What a request asks of the output beyond text: ``response_format`` (JSON by
constrained decoding) and ``logprobs`` (docs/protocol-notes.md "Output
features").

``response_format_parse`` and ``logprobs_parse`` turn a request body's fields
into what the offer carries, or raise ``ApiError(400)`` naming the field; a
``json_schema`` only within the subset engines enforce (``jobs.schemas``).
A job's ``params`` keep the ``response_format`` as JSON text
(``response_format_stored``): PostgreSQL's ``jsonb`` would reorder a schema's
properties, and the order of the properties is the order of the output.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import ApiError
from .schemas import schema_checked

MAX_TOP_LOGPROBS = 20
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, "invalid_request", param=param)


def response_format_parse(value: Any, *, endpoint: str) -> dict | None:
    """The ``response_format`` an offer carries, or None for plain text.

    ``{"type": "text"}`` (or null) asks nothing; ``{"type": "json_object"}``
    is kept as is; ``{"type": "json_schema", "json_schema": {"name", "schema",
    "strict"?, "description"?}}`` becomes ``{"type": "json_schema",
    "json_schema": {"name", "schema": <its constraints, annotations dropped>,
    "strict": true}}`` (decoding is always constrained: strict or not, the
    output matches the schema). Chat only (``endpoint == "chat"``), as OpenAI.
    Raises ApiError 400 naming the field.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad("response_format", "'response_format' must be an object")
    kind = value.get("type")
    if kind == "text" and set(value) == {"type"}:
        return None
    if kind not in ("text", "json_object", "json_schema"):
        raise _bad(
            "response_format.type",
            "'response_format.type' must be 'text', 'json_object' or 'json_schema'",
        )
    if endpoint != "chat":
        raise _bad(
            "response_format",
            "'response_format' is supported on /v1/chat/completions only",
        )
    extra = set(value) - {"type", "json_schema"}
    if extra or (kind != "json_schema" and "json_schema" in value):
        field = sorted(extra)[0] if extra else "json_schema"
        raise _bad(
            f"response_format.{field}",
            f"'response_format.{field}' is not a field of a {kind} response_format",
        )
    if kind == "json_object":
        return {"type": "json_object"}
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise _bad(
            "response_format.json_schema",
            "'response_format.json_schema' must be an object with a name and a schema",
        )
    unknown = set(spec) - {"name", "schema", "strict", "description"}
    if unknown:
        field = sorted(unknown)[0]
        raise _bad(
            f"response_format.json_schema.{field}",
            f"'response_format.json_schema.{field}' is not a json_schema field",
        )
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(
            "response_format.json_schema.name",
            "'response_format.json_schema.name' must be 1-64 letters, digits, "
            "'_' or '-'",
        )
    if spec.get("strict") not in (None, True, False):
        raise _bad(
            "response_format.json_schema.strict",
            "'response_format.json_schema.strict' must be true or false",
        )
    if not isinstance(spec.get("description", ""), str):
        raise _bad(
            "response_format.json_schema.description",
            "'response_format.json_schema.description' must be a string",
        )
    if "schema" not in spec:
        raise _bad(
            "response_format.json_schema.schema",
            "'response_format.json_schema.schema' is required",
        )
    schema = schema_checked(spec["schema"], param="response_format.json_schema.schema")
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": schema, "strict": True},
    }


def logprobs_parse(body: dict, *, endpoint: str) -> int | None:
    """How many alternatives per token the request wants with its tokens'
    log-probabilities (0 to ``MAX_TOP_LOGPROBS``), or None when it wants none.

    Chat: ``logprobs`` true/false and ``top_logprobs`` (an integer, only with
    ``logprobs: true``, as OpenAI). Completions: ``logprobs`` the integer
    itself. Raises ApiError 400 naming the field.
    """
    value = body.get("logprobs")
    top = body.get("top_logprobs")
    if endpoint != "chat":
        if top is not None and top != 0:
            raise _bad(
                "top_logprobs",
                "'top_logprobs' is a chat field; /v1/completions takes "
                "'logprobs' as the number of alternatives",
            )
        if value is None or value is False:
            return None
        return _top_count(value, "logprobs")
    if value is not None and not isinstance(value, bool):
        raise _bad("logprobs", "'logprobs' must be true or false")
    if top is not None and not value and _top_count(top, "top_logprobs") == 0:
        top = None  # 0 alternatives and no logprobs: what clients send by default
    if top is not None:
        top = _top_count(top, "top_logprobs")
        if not value:
            raise _bad(
                "top_logprobs", "'top_logprobs' needs 'logprobs' to be true"
            )
    if not value:
        return None
    return top or 0


def _top_count(value: Any, param: str) -> int:
    """``value`` as a count of alternatives (3.0 is the integer 3)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 0 <= value <= MAX_TOP_LOGPROBS
    ):
        raise _bad(
            param, f"'{param}' must be an integer from 0 to {MAX_TOP_LOGPROBS}"
        )
    return value


def response_format_stored(response_format: dict) -> str:
    """A ``response_format`` as a job's ``params`` keep it: JSON text, its
    keys in their order."""
    return json.dumps(response_format, ensure_ascii=False, separators=(",", ":"))


def response_format_of(params: dict) -> dict | None:
    """The ``response_format`` a job's ``params`` keep, or None (plain text)."""
    stored = params.get("response_format")
    return json.loads(stored) if stored else None


IDS_NEEDED_ABOVE_TEMPERATURE = 1.0
"""The temperature above which an answer is verifiable only by the token ids
its host drew (its text tokenized again strays from the model's support too
often: docs/trust.md), so such a job goes to an engine that sends them."""


def features_needed(params: dict) -> tuple[str, ...]:
    """The engine features (``hosts.protocol.FEATURES``) a job with these
    ``params`` needs of its device: ``json_object`` or ``json_schema`` for its
    ``response_format``, ``logprobs`` for its ``logprobs``, ``token_ids``
    above ``IDS_NEEDED_ABOVE_TEMPERATURE`` (DESIGN.md "Picking a device", rule
    6, as docs/design-notes.md extends it)."""
    needs = []
    response_format = response_format_of(params)
    if response_format:
        needs.append(response_format["type"])
    if params.get("logprobs") is not None:
        needs.append("logprobs")
    temperature = params.get("temperature")
    if temperature is not None and float(temperature) > IDS_NEEDED_ABOVE_TEMPERATURE:
        needs.append("token_ids")
    return tuple(needs)


_JSON_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def answer_ruled_out(
    params: dict, text: str, finish_reason: str, token_ids: list[int] | None
) -> str:
    """Why a whole answer (a host's ``done``: ``finish_reason``,
    ``token_ids``) cannot be what an honest engine declaring the job's
    features wrote, or '' (DESIGN.md "Verification": the coordinator judges
    what it can itself). Above ``IDS_NEEDED_ABOVE_TEMPERATURE`` its
    ``token_ids`` must come (the engine declared ``token_ids``). Under a
    ``response_format``, judged only when the model ended it
    (``finish_reason`` ``stop``) and the request has no ``stop`` sequence:
    a grammar lets the model end only once its JSON is complete, while
    ``max_tokens`` or a stop sequence may cut it anywhere. Under
    ``json_object`` or ``json_schema`` (``tools`` too) the text must be JSON,
    an object for ``json_object``, of the schema's root type where it names
    one; ``json_sequence`` is not judged here (its parts are)."""
    if token_ids is None and "token_ids" in features_needed(params):
        return "an answer sampled above temperature 1 without its token ids"
    response_format = response_format_of(params)
    if (
        response_format is None
        or response_format["type"] not in ("json_object", "json_schema")
        or finish_reason != "stop"
        or params.get("stop")
    ):
        return ""
    try:
        value = json.loads(text)
    except ValueError:
        return "an answer under a JSON response_format that is not JSON"
    except RecursionError:  # (deeper than this process parses: not judged)
        return ""
    if response_format["type"] == "json_object":
        wanted = "object"
    else:
        wanted = response_format["json_schema"]["schema"].get("type")
    kind = _JSON_TYPES.get(wanted) if isinstance(wanted, str) else None
    if kind is not None and not isinstance(value, kind):
        return f"an answer whose JSON is not the {wanted} its response_format asks"
    return ""
