"""Renter completions over HTTP: ``POST /v1/chat/completions`` and ``/v1/completions``.

Async views (ASGI). A streamed request answers with server-sent events; the
status code waits for the job's first event, so a failure before any output is an
ordinary 502/503/504 in OpenAI's error shape. A failure after output ends the
stream with a ``finish_reason: "error"`` chunk carrying an ``error`` object.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from ballast.db import db_call
from catalog.models import CatalogModel

from .auth import bearer_from_header
from .chunks import ChunkWriter, sse
from .errors import (
    RETRY_AFTER_S,
    ApiError,
    error_body,
    error_response,
    failure_error,
)
from .models import Job
from .orchestration import Failed, Finished, JobRun, Token, job_channel_open
from .requests import CompletionRequest, completion_request_parse
from .services import Dispatch, api_key_authenticate, job_open, unauthorized


def _job_open(
    authorization: str, raw: bytes, endpoint: str, channel: str
) -> tuple[Job, CatalogModel, CompletionRequest, Dispatch]:
    """Parse and admit a request (``services.job_open``: its one transaction), in
    a worker thread. The key is checked before the body is judged: a caller
    without a live key learns nothing of its request. Raises ApiError 401 (key),
    400 (body), and as ``services.job_open``."""
    plain = bearer_from_header(authorization)
    try:
        parsed = _request_parse(raw, endpoint)
    except ApiError:
        if api_key_authenticate(plain=plain) is None:
            raise unauthorized() from None
        raise
    job, model, dispatch = job_open(
        api_key=plain, request=parsed, waiting_channel=channel
    )
    return job, model, parsed, dispatch


def _request_parse(raw: bytes, endpoint: str) -> CompletionRequest:
    """The checked request of body ``raw``; ApiError 400 when it is not JSON or
    not a valid request."""
    try:
        body = json.loads(raw or b"")
    except (ValueError, RecursionError):
        raise ApiError(
            400, "the request body is not valid JSON", "invalid_json", "body"
        ) from None
    return completion_request_parse(body, endpoint=endpoint)


async def _completion(request: HttpRequest, endpoint: str) -> HttpResponse:
    """A completion request, answered in OpenAI's shape whatever happens before
    the response starts: a database that cannot be reached is a 503 to retry
    (a job already stored is closed, billed nothing), anything unexpected a 500
    (logged), never Django's HTML error page."""
    try:
        return await _completion_answer(request, endpoint)
    except Exception as exc:
        return error_response(failure_error(exc, "completion"))


def body_too_large_response() -> JsonResponse:
    """The 413 of a request body past ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (OpenAI's
    error shape; also sent by ``ballast.asgi.ApiHandler`` before reading it)."""
    return error_response(
        ApiError(
            413,
            "the request body is larger than the server accepts",
            "body_too_large",
            "body",
        )
    )


async def _completion_answer(request: HttpRequest, endpoint: str) -> HttpResponse:
    if request.method != "POST":
        response = JsonResponse(
            error_body(405, "use POST", "method_not_allowed"), status=405
        )
        response["Allow"] = "POST"
        return response
    try:
        raw = request.body
    except RequestDataTooBig:
        return body_too_large_response()
    authorization = request.headers.get("Authorization", "")
    try:
        channel, (job, model, parsed, dispatch) = await job_channel_open(
            lambda channel: db_call(_job_open)(authorization, raw, endpoint, channel)
        )
    except ApiError as exc:
        return error_response(exc)
    writer = ChunkWriter(job, parsed)
    events = JobRun(
        job,
        model=model,
        channel=channel,
        dispatch=dispatch,
        whole_at_end=not parsed.stream,
    ).events()
    headers = {"x-ballast-job-id": str(job.id)}
    try:
        first = await anext(events)
    except BaseException:
        await events.aclose()
        raise
    if isinstance(first, Failed):
        await events.aclose()
        retry = RETRY_AFTER_S if first.status in (429, 503) else None
        response = error_response(
            ApiError(first.status, first.message, first.code, retry_after_s=retry)
        )
    elif parsed.stream:
        response = StreamingHttpResponse(
            _stream(first, events, writer, parsed), content_type="text/event-stream"
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
    else:
        response = await _collect(first, events, writer, parsed)
    for name, value in headers.items():
        response[name] = value
    return response


async def _collect(
    first, events: AsyncIterator, writer: ChunkWriter, parsed: CompletionRequest
) -> JsonResponse:
    pieces: list[str] = []
    # every token's logprobs, when the request asked for them
    logprobs: list[dict] | None = [] if "logprobs" in parsed.params else None
    async with aclosing(events):
        event = first
        while True:
            if isinstance(event, Token):
                pieces.append(event.text)
                if logprobs is not None:
                    logprobs.extend(event.logprobs or ())
            elif isinstance(event, Finished):
                return JsonResponse(
                    writer.whole(
                        "".join(pieces), event.finish_reason, event.usage, logprobs
                    )
                )
            elif isinstance(event, Failed):
                body = writer.whole("".join(pieces), "error", event.usage, logprobs)
                body["error"] = error_body(event.status, event.message, event.code)[
                    "error"
                ]
                return JsonResponse(body)
            event = await _event_next(events)


async def _event_next(events: AsyncIterator) -> Token | Finished | Failed:
    """The job's next event once its answer has begun; the coordinator's own
    failure meanwhile (a channel layer or database that went away: the job's
    coroutine has closed the job, billing what was delivered) is an in-band
    ``Failed`` after output, so the renter gets an error chunk, not a cut
    connection."""
    try:
        return await anext(events)
    except StopAsyncIteration:
        raise
    except Exception as exc:
        error = failure_error(exc, "completion after output")
        return Failed(error.status, error.code, error.message, after_output=True)


async def _stream(
    first, events: AsyncIterator, writer: ChunkWriter, parsed: CompletionRequest
):
    async with aclosing(events):
        event = first
        while True:
            if isinstance(event, Token):
                data = writer.token_sse(event.text, event.logprobs)
                if data:  # a tool call's name still being written: nothing yet
                    yield data
            else:
                if isinstance(event, Finished):
                    yield sse(writer.chunk(finish_reason=event.finish_reason))
                else:
                    chunk = writer.chunk(finish_reason="error")
                    chunk["error"] = error_body(
                        event.status, event.message, event.code
                    )["error"]
                    yield sse(chunk)
                if parsed.include_usage:
                    yield sse(writer.usage_chunk(event.usage))
                yield sse("[DONE]")
                return
            event = await _event_next(events)


@csrf_exempt
def not_found(request: HttpRequest) -> JsonResponse:
    """Any other ``/v1/`` path: an OpenAI-shaped 404 (never an HTML page)."""
    return JsonResponse(
        error_body(
            404, f"no such API endpoint: {request.method} {request.path}", "not_found"
        ),
        status=404,
    )


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    """``POST /v1/chat/completions`` (OpenAI-compatible, PROTOCOL.md §1)."""
    return await _completion(request, Job.Endpoint.CHAT)


@csrf_exempt
async def completions(request: HttpRequest) -> HttpResponse:
    """``POST /v1/completions`` with a raw ``prompt`` (OpenAI-compatible)."""
    return await _completion(request, Job.Endpoint.COMPLETION)
