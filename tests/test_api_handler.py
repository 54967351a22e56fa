"""``ballast.asgi``'s completions handler, on the production ASGI path (not Django's
test client): answers like Django would, without making threads per request."""

from __future__ import annotations

import json
import threading

import pytest
from asgiref.testing import ApplicationCommunicator

from ballast.asgi import application

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def _post(path: str, body: bytes, headers: list) -> tuple[int, dict]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": body})
    start = await communicator.receive_output(5)
    assert start["type"] == "http.response.start"
    payload = b""
    while True:
        message = await communicator.receive_output(5)
        payload += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(5)
    return start["status"], json.loads(payload)


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
