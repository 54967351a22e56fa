"""Renter completions over HTTP: ``POST /v1/chat/completions`` and ``/v1/completions``.

Async views (ASGI). A streamed request answers with server-sent events; the
status code waits for the job's first event, so a failure before any output is an
ordinary 502/503/504 in OpenAI's error shape. A failure after output ends the
stream with a ``finish_reason: "error"`` chunk carrying an ``error`` object.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from ballast.db import db_call

from .auth import (
    api_key_and_model_from_request_header,
    api_key_from_request_header,
    bearer_from_header,
)
from .errors import ApiError, error_body, error_response, failure_error
from .models import CatalogModel, Job
from .orchestration import (
    EarlyOffer,
    Failed,
    Finished,
    JobRun,
    Token,
    job_channel_open,
)
from .requests import CompletionRequest, completion_request_parse
from .services import Dispatch, job_open, job_open_by_key, job_open_by_key_async


class ChunkWriter:
    """Builds OpenAI response objects (chunks and whole responses) for one job."""

    def __init__(self, job: Job, request: CompletionRequest) -> None:
        self.job = job
        self.chat = request.endpoint == Job.Endpoint.CHAT
        self.model = request.model
        self.created = int(time.time())
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{job.id}"
        self.first = True
        self._around: dict[str, tuple] = {}

    def _base(self, choices: list) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def chunk(self, text: str = "", finish_reason: str | None = None) -> dict:
        """A streamed chunk carrying ``text`` (and the finish reason, at the end)."""
        if self.chat:
            delta: dict = {"content": text} if text or finish_reason is None else {}
            if self.first:
                delta["role"] = "assistant"
                self.first = False
            choice = {
                "index": 0,
                "delta": delta,
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        return self._base([choice])

    def token_sse(self, text: str) -> bytes:
        """The server-sent event of ``_sse(self.chunk(text))``, byte for byte.

        After the first chunk every text chunk differs only by its text: the JSON
        around it is serialised once per job and the text alone per token.
        """
        return self._token(text, "sse")

    def token_json(self, text: str) -> str:
        """``json.dumps(self.chunk(text))`` (the renter websocket's message), exactly."""
        return self._token(text, "json")

    def _token(self, text, form: str):
        if self.first or not text:
            chunk = self.chunk(text)
            return _sse(chunk) if form == "sse" else json.dumps(chunk)
        around = self._around.get(form)
        if around is None:
            # the chunk of a one-character marker, split at the marker's JSON string
            chunk = self.chunk("\x01")
            whole = _sse(chunk) if form == "sse" else json.dumps(chunk).encode()
            parts = whole.split(b'"\\u0001"')
            if len(parts) != 2:  # the marker elsewhere too: no shortcut
                parts = None
            elif form == "json":
                parts = [part.decode() for part in parts]
            around = self._around[form] = tuple(parts) if parts else ()
        if not around:
            chunk = self.chunk(text)
            return _sse(chunk) if form == "sse" else json.dumps(chunk)
        head, tail = around
        if form == "sse":
            return head + json.dumps(text).encode() + tail
        return head + json.dumps(text) + tail

    def usage_chunk(self, usage: dict) -> dict:
        """The final usage chunk of ``stream_options.include_usage``."""
        return {**self._base([]), "usage": usage}

    def whole(self, text: str, finish_reason: str, usage: dict) -> dict:
        """A non-streamed response object."""
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
                "logprobs": None,
            }
            kind = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "finish_reason": finish_reason,
                "logprobs": None,
            }
            kind = "text_completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }


def _sse(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


async def _job_open(
    authorization: str, raw: bytes, endpoint: str, channel: str
) -> tuple[Job, CatalogModel, CompletionRequest, Dispatch]:
    """Authorize, parse, store and first-dispatch a request: the request path's one
    database step (one transaction for the job and its claim).

    On PostgreSQL, for a key and model seen before, the step is awaited in the
    event loop (``services.job_open_by_key_async``: one message on an async
    connection, no worker thread) while at most ``STEPS_IN_LOOP_AT_ONCE`` run
    there (past that, the same one round trip from a worker thread); everything
    else (a body that fails to parse, SQLite, a first request, a changed
    catalog, …) takes ``_job_open_in_thread``.
    Raises ApiError 401 (key), 400 (body), and as ``services.job_open``.
    """
    global _steps_in_loop
    if _steps_in_loop >= STEPS_IN_LOOP_AT_ONCE:
        return await db_call(_job_open_in_thread)(
            authorization, raw, endpoint, channel, by_key=True
        )
    _steps_in_loop += 1
    try:
        return await _job_open_in_loop(authorization, raw, endpoint, channel)
    finally:
        _steps_in_loop -= 1


# the request steps running in the event loop now, and at most how many. The
# loop is the one thread that also relays every answer: in a burst (50 requests
# at once) the steps' Python there made it the bottleneck (py-spy: its samples
# +55 %, first tokens later), so past this a step runs in a worker thread, where
# its database wait does not cost the loop (docs/performance.md)
_steps_in_loop = 0
STEPS_IN_LOOP_AT_ONCE = 2


async def _job_open_in_loop(
    authorization: str, raw: bytes, endpoint: str, channel: str
) -> tuple[Job, CatalogModel, CompletionRequest, Dispatch]:
    """``_job_open`` in the event loop (see there)."""
    try:
        parsed = _request_parse(raw, endpoint)
    except ApiError:
        return await db_call(_job_open_in_thread)(authorization, raw, endpoint, channel)
    early = EarlyOffer(channel)
    try:
        opened = await job_open_by_key_async(
            plain=bearer_from_header(authorization),
            request=parsed,
            waiting_channel=channel,
            offer_now=early.send,
            guessed_offer=early,
        )
    except BaseException:
        await early.cancel()
        raise
    if opened is None:
        return await db_call(_job_open_in_thread)(
            authorization, raw, endpoint, channel, parsed=parsed
        )
    _, job, model, dispatch = opened  # the key's last use was written with it
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


def _job_open_in_thread(
    authorization: str,
    raw: bytes,
    endpoint: str,
    channel: str,
    parsed: CompletionRequest | None = None,
    by_key: bool = False,
) -> tuple[Job, CatalogModel, CompletionRequest, Dispatch]:
    """``_job_open`` in a worker thread (``parsed``: the body, when it parsed;
    ``by_key``: try ``job_open_by_key``'s one round trip first, as the loop
    would have).

    The key is checked before the body (a caller without a valid key learns
    nothing of its request), in the statement that also reads the request's
    catalog model.
    """
    if parsed is None:
        try:
            parsed = _request_parse(raw, endpoint)
        except ApiError as refused:
            if api_key_from_request_header(authorization) is None:
                raise _unauthorized() from None
            raise refused
    if by_key:
        opened = job_open_by_key(
            plain=bearer_from_header(authorization),
            request=parsed,
            waiting_channel=channel,
        )
        if opened is not None:
            _, job, model, dispatch = opened
            return job, model, parsed, dispatch
    key, model = api_key_and_model_from_request_header(authorization, parsed.model)
    if key is None:
        raise _unauthorized()
    job, model, dispatch = job_open(
        api_key=key, request=parsed, waiting_channel=channel, model=model
    )
    return job, model, parsed, dispatch


def _unauthorized() -> ApiError:
    return ApiError(401, "missing, invalid or revoked API key", "invalid_api_key")


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
            lambda channel: _job_open(authorization, raw, endpoint, channel)
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
        response = JsonResponse(
            error_body(first.status, first.message, first.code), status=first.status
        )
    elif parsed.stream:
        response = StreamingHttpResponse(
            _stream(first, events, writer, parsed), content_type="text/event-stream"
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
    else:
        response = await _collect(first, events, writer)
    for name, value in headers.items():
        response[name] = value
    return response


async def _collect(first, events: AsyncIterator, writer: ChunkWriter) -> JsonResponse:
    pieces: list[str] = []
    async with aclosing(events):
        event = first
        while True:
            if isinstance(event, Token):
                pieces.append(event.text)
            elif isinstance(event, Finished):
                return JsonResponse(
                    writer.whole("".join(pieces), event.finish_reason, event.usage)
                )
            elif isinstance(event, Failed):
                body = writer.whole("".join(pieces), "error", event.usage)
                body["error"] = error_body(event.status, event.message, event.code)[
                    "error"
                ]
                return JsonResponse(body)
            event = await anext(events)


async def _stream(
    first, events: AsyncIterator, writer: ChunkWriter, parsed: CompletionRequest
):
    async with aclosing(events):
        event = first
        while True:
            if isinstance(event, Token):
                yield writer.token_sse(event.text)
            else:
                if isinstance(event, Finished):
                    yield _sse(writer.chunk(finish_reason=event.finish_reason))
                else:
                    chunk = writer.chunk(finish_reason="error")
                    chunk["error"] = error_body(
                        event.status, event.message, event.code
                    )["error"]
                    yield _sse(chunk)
                if parsed.include_usage:
                    yield _sse(writer.usage_chunk(event.usage))
                yield _sse("[DONE]")
                return
            event = await anext(events)


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
