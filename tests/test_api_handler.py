"""``ballast.asgi``'s completions handler, on the production ASGI path (not Django's
test client): answers like Django would, without making threads per request."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest
import pytest_asyncio
from asgiref.testing import ApplicationCommunicator

from ballast.asgi import HeadersWithFirstBody, application

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def _scope(path: str, headers: list) -> dict:
    return {
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
    communicator = ApplicationCommunicator(application, _scope(path, headers))
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


async def _completion_sent(
    api_key: str, model: str, content: str, *, stream: bool = True
) -> ApplicationCommunicator:
    """A chat completion (streamed unless ``stream=False``) sent through the
    production ASGI app."""
    body = json.dumps(
        {
            "model": model,
            "stream": stream,
            "messages": [{"role": "user", "content": content}],
        }
    ).encode()
    headers = [(b"authorization", f"Bearer {api_key}".encode())]
    communicator = ApplicationCommunicator(
        application, _scope("/v1/chat/completions", headers)
    )
    await communicator.send_input({"type": "http.request", "body": body})
    return communicator


async def test_a_renter_going_away_mid_stream_cancels_the_job_and_bills_what_it_got(
    api_key, catalog, machine_token
):
    from jobs.models import Attempt, Job
    from tests.jobs.helpers import host_online

    host = await host_online(machine_token, "rig")
    communicator = await _completion_sent(api_key, catalog.id, "Count")
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], "One,")
    start = await communicator.receive_output(5)
    assert start["status"] == 200
    first = await communicator.receive_output(5)
    assert b'"content":"One,"' in first["body"]
    await communicator.send_input({"type": "http.disconnect"})
    assert (await host.recv_type("cancel"))["job"] == offer["job"]
    await communicator.wait(5)
    attempt = await Attempt.objects.select_related("job", "device").aget(
        id=offer["job"]
    )
    assert attempt.outcome == "cancelled" and attempt.device.slots_used == 0
    assert attempt.job.status == Job.Status.CANCELLED
    assert attempt.job.output_text == "One," and attempt.job.tokens_billed >= 1
    await host.close()


@pytest_asyncio.fixture
async def abandoning(monkeypatch) -> asyncio.Event:
    """Set when a view cancelled during its database step hands the step to
    ``orchestration.channels._job_abandon``."""
    from jobs.orchestration import channels as orchestration

    event = asyncio.Event()
    real_abandon = orchestration._job_abandon

    async def abandon(step):
        event.set()
        await real_abandon(step)

    monkeypatch.setattr(orchestration, "_job_abandon", abandon)
    return event


async def test_a_renter_gone_during_the_database_step_leaves_no_job_holding_a_slot(
    api_key, catalog, machine_token, monkeypatch, abandoning
):
    """The step finishes in its thread after the renter left; what it stored is
    closed at once (cancelled, slot freed, nothing billed), no offer goes out."""
    import asyncio

    from hosts.models import Device
    from jobs import views
    from jobs.models import Job
    from tests.jobs.helpers import host_online

    host = await host_online(machine_token, "rig")
    entered, gate = threading.Event(), threading.Event()
    real_step = views._job_open

    def held_step(*args):
        entered.set()
        gate.wait(10)
        return real_step(*args)

    monkeypatch.setattr(views, "_job_open", held_step)
    communicator = await _completion_sent(api_key, catalog.id, "x")
    assert await asyncio.to_thread(entered.wait, 5)
    await communicator.send_input({"type": "http.disconnect"})
    await asyncio.wait_for(abandoning.wait(), 5)  # the view cancelled mid-step
    gate.set()
    await communicator.wait(5)
    job = await Job.objects.aget()
    assert job.status == Job.Status.CANCELLED and job.cost_nano == 0
    assert await Device.objects.filter(slots_used__gt=0).acount() == 0
    assert await host.ws.receive_nothing(timeout=0.2), "no offer for an abandoned job"
    await host.close()


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


class _Server:
    """A stand-in for uvicorn's request cycle: ``send`` is a bound method of an
    object with the connection's ``transport`` (a real TCP connection), and
    records whether the socket held its output (``TCP_CORK``) at each message."""

    def __init__(self, transport) -> None:
        self.transport = transport
        self.held_at: list[tuple[str, int]] = []

    async def send(self, message: dict) -> None:
        sock = self.transport.get_extra_info("socket")
        held = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK)
        self.held_at.append((message["type"], held))
        self.transport.write(message.get("body", b"") or b"h")


@pytest_asyncio.fixture
async def tcp_transport():
    """The server side of a real loopback TCP connection (asyncio's transport)."""
    accepted: asyncio.Future = asyncio.get_running_loop().create_future()

    async def on_client(reader, writer):
        accepted.set_result(writer)

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, client = await asyncio.open_connection("127.0.0.1", port)
    writer = await accepted
    yield writer.transport
    client.close()
    writer.close()
    server.close()
    await server.wait_closed()


@pytest.fixture
def corked(tcp_transport):
    """(the stand-in server, its ``send`` wrapped, the connection's socket)."""
    if not hasattr(socket, "TCP_CORK"):
        pytest.skip("Linux TCP_CORK")
    server = _Server(tcp_transport)
    return (
        server,
        HeadersWithFirstBody(server.send),
        tcp_transport.get_extra_info("socket"),
    )


@pytest.mark.django_db(transaction=False)
async def test_response_headers_are_held_until_the_first_body_is_written(corked):
    server, send, sock = corked
    await send({"type": "http.response.start", "status": 200, "headers": []})
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 1
    await send({"type": "http.response.body", "body": b"first", "more_body": True})
    # written while held, then let go: headers and first chunk in one segment
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0
    await send({"type": "http.response.body", "body": b"second", "more_body": True})
    send.release()  # nothing held: a no-op
    assert server.held_at == [
        ("http.response.start", 1),
        ("http.response.body", 1),
        ("http.response.body", 0),
    ]


@pytest.mark.django_db(transaction=False)
async def test_a_response_that_ends_without_a_body_lets_its_headers_go(
    corked, tcp_transport
):
    _, send, sock = corked
    await send({"type": "http.response.start", "status": 200, "headers": []})
    send.release()
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0
    tcp_transport.close()
    send.release()  # a closed connection: nothing to do, no error


@pytest.mark.django_db(transaction=False)
async def test_a_send_without_a_socket_goes_straight_through():
    sent = []

    async def send(message):
        sent.append(message["type"])

    wrapped = HeadersWithFirstBody(send)
    await wrapped({"type": "http.response.start", "status": 200, "headers": []})
    await wrapped({"type": "http.response.body", "body": b"x"})
    wrapped.release()
    assert sent == ["http.response.start", "http.response.body"]
    assert wrapped.socket is None and not wrapped.held


async def _declared(path: str, headers: list, chunks: list[bytes]) -> dict:
    """Send a request's body in ``chunks`` (the last says no more); the response's
    start, read as soon as it comes (before the rest is sent, if it comes early)."""
    communicator = ApplicationCommunicator(application, _scope(path, headers))
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
        application, {**_scope("/v1/chat/completions", []), "method": "GET"}
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


@pytest_asyncio.fixture
async def relayed(monkeypatch):
    """``relayed(text)``: waits until the job's coroutine took ``text`` from its
    host (``OutputBudget.take``), so a test acts after a token reached the job."""
    from jobs.orchestration.budget import OutputBudget

    taken: list[str] = []
    changed = asyncio.Event()
    real = OutputBudget.take

    def spy(self, text):
        taken.append(text)
        changed.set()
        return real(self, text)

    monkeypatch.setattr(OutputBudget, "take", spy)

    async def wait_for(text: str) -> None:
        async with asyncio.timeout(5):
            while text not in "".join(taken):
                changed.clear()
                await changed.wait()

    return wait_for


@pytest.mark.parametrize("continued", [False, True], ids=["one host", "continuation"])
async def test_a_renter_gone_before_its_non_streamed_response_is_billed_nothing(
    api_key, catalog, machine_token, fast_deadlines, relayed, continued
):
    """DESIGN.md "Money": renters pay for what they received. A non-streamed
    answer reaches the renter only in its response: a renter who left before it
    received nothing, whatever the hosts generated (the attempts keep their text
    for the record, billed nothing; no charge, no host paid)."""
    from billing.models import LedgerTransaction
    from hosts.models import Device
    from jobs.models import Attempt, Job
    from tests.jobs.helpers import host_online

    first = await host_online(machine_token, "first", score=90)
    second = await host_online(machine_token, "second", score=60)
    communicator = await _completion_sent(api_key, catalog.id, "Count", stream=False)
    offer = await first.recv_type("offer")
    await first.claim(offer["job"])
    await first.token(offer["job"], "One, two,")
    await relayed("One, two,")
    host, job_offer = first, offer
    if continued:
        await first.close()  # gone mid-answer: the continuation takes over
        job_offer = await second.recv_type("offer")
        assert job_offer["continue_from"] == "One, two,"
        host = second
        await host.claim(job_offer["job"])
        await host.token(job_offer["job"], " three,")
        await relayed(" three,")
    await communicator.send_input({"type": "http.disconnect"})
    assert (await host.recv_type("cancel"))["job"] == job_offer["job"]
    await communicator.wait(5)
    job = await Job.objects.aget(attempts__id=offer["job"])
    assert job.status == Job.Status.CANCELLED
    assert (job.tokens_billed, job.cost_nano, job.output_text) == (0, 0, "")
    attempts = [a async for a in Attempt.objects.filter(job=job).order_by("offered_at")]
    assert [a.tokens_billed for a in attempts] == [0] * len(attempts)
    assert "".join(a.output_text for a in attempts) == (
        "One, two, three," if continued else "One, two,"
    )
    assert not await LedgerTransaction.objects.filter(job=job).aexists()
    assert await Device.objects.filter(slots_used__gt=0).acount() == 0
    await second.close()
    if not continued:
        await first.close()
