"""``ballast.asgi``'s completions handler, on the production ASGI path (not Django's
test client): answers like Django would, without making threads per request.

A renter gone mid-request: ``test_handler_renter_gone.py``; the response's
headers held for its first body: ``test_headers_held.py``.
"""

from __future__ import annotations

import json
import threading

import pytest
from asgiref.testing import ApplicationCommunicator

from ballast.asgi import application

from .helpers import http_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def _response(communicator: ApplicationCommunicator) -> tuple[int, bytes]:
    """The status and the whole body of the response the app sends."""
    start = await communicator.receive_output(5)
    assert start["type"] == "http.response.start"
    body = b""
    while True:
        message = await communicator.receive_output(5)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(5)
    return start["status"], body


async def _post(path: str, body: bytes, headers: list) -> tuple[int, dict]:
    communicator = ApplicationCommunicator(application, http_scope(path, headers))
    await communicator.send_input({"type": "http.request", "body": body})
    status, payload = await _response(communicator)
    return status, json.loads(payload)


async def test_completions_refuse_a_bad_key_in_openai_shape_without_a_thread_per_request(
    monkeypatch,
):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    headers = [(b"authorization", b"Bearer not-a-key")]
    await _post("/v1/chat/completions", body.encode(), headers)  # first use
    started = []
    original = threading.Thread.start

    def counting_start(thread):
        started.append(thread.name)
        original(thread)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    for _ in range(10):
        status, answer = await _post("/v1/chat/completions", body.encode(), headers)
        assert status == 401
        assert answer["error"]["code"] == "invalid_api_key"
    # Django's own handler makes a one-thread executor per request (and a thread
    # to join it): 10 requests, 20 threads. Here: at most a pool's warm-up.
    assert len(started) <= 2, started


async def test_other_pages_still_go_through_django_with_its_middleware():
    status, answer = await _post("/v1/no-such-endpoint", b"{}", [])
    assert status == 404
    assert answer["error"]["code"] == "not_found"


async def test_a_doubled_slash_before_v1_gets_the_apis_json_404():
    """A client whose base URL ends in a slash asks for ``//v1/…``."""
    status, answer = await _post("//v1/chat/completions", b"{}", [])
    assert status == 404 and answer["error"]["code"] == "not_found"
    assert "//v1/chat/completions" in answer["error"]["message"]


async def test_the_key_is_checked_before_the_body_and_the_model(api_key, catalog):
    """A caller without a valid key learns nothing of its request (401 whatever the
    body); with one, the body's errors and an unknown model come back as such."""
    bad_key = [(b"authorization", b"Bearer not-a-key")]
    good_key = [(b"authorization", f"Bearer {api_key}".encode())]
    unknown_model = json.dumps(
        {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    for body in (b"{not json", b'{"model": "m"}', unknown_model):
        status, answer = await _post("/v1/chat/completions", body, bad_key)
        assert (status, answer["error"]["code"]) == (401, "invalid_api_key")
    status, answer = await _post("/v1/chat/completions", b"{not json", good_key)
    assert (status, answer["error"]["code"]) == (400, "invalid_json")
    status, answer = await _post("/v1/chat/completions", b'{"model": "m"}', good_key)
    assert status == 400 and answer["error"]["param"] == "messages"
    status, answer = await _post("/v1/chat/completions", unknown_model, good_key)
    assert (status, answer["error"]["code"]) == (404, "model_not_found")


@pytest.mark.parametrize(
    "failure, status, code",
    [
        ("database", 503, "service_unavailable"),
        ("bug", 500, "internal_error"),
    ],
)
async def test_a_failing_step_is_answered_in_openai_shape_not_an_html_page(
    api_key, catalog, monkeypatch, failure, status, code
):
    from django.db import OperationalError

    from jobs import views

    def failing_step(*args):
        if failure == "database":
            raise OperationalError(
                "consuming input failed: server closed the connection"
            )
        raise RuntimeError("a bug")

    monkeypatch.setattr(views, "_job_open", failing_step)
    body = json.dumps(
        {"model": catalog.id, "messages": [{"role": "user", "content": "x"}]}
    ).encode()
    headers = [(b"authorization", f"Bearer {api_key}".encode())]
    got_status, answer = await _post("/v1/chat/completions", body, headers)
    assert (got_status, answer["error"]["code"]) == (status, code)


async def test_the_json_apis_answer_a_lost_database_in_openai_shape(
    api_key, monkeypatch
):
    from django.db import OperationalError
    from django.test import AsyncClient

    from jobs.apis import ModelsApi

    def failing_get(self, request):
        raise OperationalError("the connection was closed")

    monkeypatch.setattr(ModelsApi, "get", failing_get)
    response = await AsyncClient().get(
        "/v1/models", headers={"Authorization": f"Bearer {api_key}"}
    )
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "service_unavailable"


async def _declared(path: str, headers: list, chunks: list[bytes]) -> dict:
    """Send a request's body in ``chunks`` (the last says no more); the response's
    start, read as soon as it comes (before the rest is sent, if it comes early)."""
    communicator = ApplicationCommunicator(application, http_scope(path, headers))
    for n, chunk in enumerate(chunks):
        more = n < len(chunks) - 1
        await communicator.send_input(
            {"type": "http.request", "body": chunk, "more_body": more}
        )
    start = await communicator.receive_output(5)
    body = await communicator.receive_output(5)
    await communicator.wait(5)
    return {**start, "json": json.loads(body["body"])}


async def test_a_body_declared_too_large_is_refused_before_it_is_read(settings):
    """No key, a Content-Length of a gigabyte and no byte of it sent: 413 at once
    (found: the server read and stored the whole body before refusing it)."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    headers = [(b"content-length", str(10**9).encode())]
    answer = await _declared("/v1/chat/completions", headers, [b""] * 2)
    assert answer["status"] == 413 and answer["json"]["error"]["code"] == (
        "body_too_large"
    )


async def test_a_body_growing_past_the_limit_is_refused_as_it_comes(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    chunks = [b"x" * 600, b"x" * 600, b"never read"]
    answer = await _declared("/v1/completions", [], chunks)
    assert answer["status"] == 413


async def test_a_method_other_than_post_is_a_405_that_names_post():
    communicator = ApplicationCommunicator(
        application, {**http_scope("/v1/chat/completions", []), "method": "GET"}
    )
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(5)
    await communicator.receive_output(5)
    await communicator.wait(5)
    assert start["status"] == 405 and (b"Allow", b"POST") in start["headers"]


async def test_the_coordinator_tunes_its_garbage_collector_once_loaded():
    """(ballast.asgi.gc_tune: the loaded code frozen out of the collector's
    walks, collections far apart; the figures are in docs/performance.md.)"""
    import gc

    from ballast import asgi

    assert gc.get_threshold() == asgi.GC_THRESHOLDS
    assert gc.get_freeze_count() > 10_000
