"""What the output-feature tests (``test_output_features_*.py``) send and expect:
a JSON schema as a renter gives it, every feature an engine may declare, and the
request parsed as the coordinator admits it."""

from __future__ import annotations

from jobs.formats import response_format_of
from jobs.requests import completion_request_parse
from tests.hostsim import MODEL

SCHEMA = {
    "title": "Answer",
    "type": "object",
    "properties": {
        "city": {"title": "City", "type": "string", "maxLength": 20},
        "population": {"type": "integer", "description": "people"},
    },
    "required": ["city", "population"],
    "additionalProperties": False,
}
JSON_SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
}
# every output feature an engine may declare (a hello's ``features``)
ALL = ("json_object", "json_schema", "logprobs")


def chat_parse(**fields):
    """A one-message chat request with ``fields``, as
    ``jobs.requests.completion_request_parse`` admits it (ApiError: refused)."""
    return completion_request_parse(
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], **fields},
        endpoint="chat",
    )


def response_format_kept(**fields) -> dict:
    """The ``response_format`` a request's job keeps (as JSON text)."""
    return response_format_of(chat_parse(**fields).params)
