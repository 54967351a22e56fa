"""The OpenAPI description of ``POST /v1/chat/completions`` and ``/v1/completions``.

They are plain async Django views (``jobs.views``), which drf-spectacular does not
enumerate, so ``completions_endpoints`` (a ``PREPROCESSING_HOOKS`` entry) adds a
documentation twin of each, a DRF view that only carries the ``extend_schema``:
the request body (``jobs.schema.completion_requests``), the answers (a JSON
object, or server-sent events with ``stream: true``:
``jobs.schema.completion_answers``) and every error status the views answer.
"""

from __future__ import annotations

from django.urls import reverse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.views import APIView

from . import RETRY_AFTER, errors
from .completion_answers import (
    CHAT_CHUNK,
    CHAT_COMPLETION,
    TEXT_CHUNK,
    TEXT_COMPLETION,
    events_schema,
)
from .completion_requests import request_schema

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
        events = {"schema": events_schema(chunk)}
        responses["200"]["content"]["text/event-stream"] = events
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
