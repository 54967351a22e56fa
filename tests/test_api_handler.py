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
from django.db import connection

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
    ``orchestration._job_abandon``."""
    from jobs import orchestration

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


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the early offer is PostgreSQL's"
)
async def test_a_renter_gone_after_the_early_offer_has_it_cancelled(
    api_key, catalog, machine_token, monkeypatch, abandoning, settings
):
    """The request step sent its offer, then the renter left before the step
    returned: the job is cancelled (slot freed, nothing billed) and the host is
    told to drop the offer."""
    settings.BALLAST_CANARY_RATE = 0  # a spot check rolled due: no early offer
    settings.BALLAST_GUESSED_OFFERS = False  # the offer after the claim
    from hosts.models import Device
    from jobs import orchestration
    from jobs.models import Job
    from tests.jobs.helpers import chat_request, host_online

    host = await host_online(machine_token, "rig")
    warm = chat_request(api_key, stream=False)  # reads the catalog hint
    await host.answer(await host.recv_type("offer"), ["hi"])
    assert (await warm).status_code == 200
    offered, gate = asyncio.Event(), asyncio.Event()
    real_send = orchestration.EarlyOffer.send

    async def send_then_wait(self, *args):
        sent = await real_send(self, *args)
        offered.set()
        await gate.wait()
        return sent

    monkeypatch.setattr(orchestration.EarlyOffer, "send", send_then_wait)
    communicator = await _completion_sent(api_key, catalog.id, "x")
    offer = await host.recv_type("offer")
    await asyncio.wait_for(offered.wait(), 5)
    await communicator.send_input({"type": "http.disconnect"})
    await asyncio.wait_for(abandoning.wait(), 5)  # the view cancelled mid-step
    gate.set()  # the step returns after its renter left
    cancel = await host.recv_type("cancel")
    assert cancel["job"] == offer["job"]
    await communicator.wait(5)  # the view ends once the job is closed
    job = await Job.objects.aget(attempts__id=offer["job"])
    assert job.status == Job.Status.CANCELLED and job.cost_nano == 0
    assert await Device.objects.filter(slots_used__gt=0).acount() == 0
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


# --- guessed offers (services.job_open_by_key_async, EarlyOffer.guess_send) ----------
postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="guessed offers are PostgreSQL's"
)


async def _events(communicator: ApplicationCommunicator) -> tuple[int, str]:
    """The status and the streamed text of a completion sent with ``_completion_sent``."""
    from tests.jobs.helpers import sse_events, sse_text

    status, body = await _response(communicator)
    return status, sse_text(sse_events(body)) if status == 200 else body.decode()


def _steps_held(monkeypatch, *, first_only: bool = False) -> tuple[asyncio.Event, list]:
    """Hold the request steps' database message (every one, or only the first)
    until the returned event is set; the list gets each step held."""
    from jobs import services

    gate, held = asyncio.Event(), []
    real_send = services._OpenStatement.send_async

    async def held_step(self, *args):
        if not (first_only and held):
            held.append(self)
            await gate.wait()
        return await real_send(self, *args)

    monkeypatch.setattr(services._OpenStatement, "send_async", held_step)
    return gate, held


async def _warmed(api_key, machine_token, settings, **hosts):
    """Hosts online (name → score) and one answered request: the key is
    trusted and the model's next pick noted (by the answer's end)."""
    from tests.jobs.helpers import chat_request, host_online

    settings.BALLAST_CANARY_RATE = 0  # a spot check rolled due: no guess
    online = {
        name: await host_online(machine_token, name, score=score)
        for name, score in hosts.items()
    }
    best = max(online, key=lambda name: hosts[name])
    for _ in range(2):  # the first reads the catalog hint, the second trusts the key
        warm = chat_request(api_key, stream=False)
        await online[best].answer(await online[best].recv_type("offer"), ["hi"])
        assert (await warm).status_code == 200
    return online


@postgresql_only
async def test_a_guessed_offer_leaves_before_the_database_answers_and_stands(
    api_key, catalog, machine_token, monkeypatch, settings
):
    """The host gets the offer while the request's database step is still
    held; what it streams meanwhile waits for the step, then reaches the renter;
    the attempt is stored under the offered id and its claim recorded."""
    from jobs.models import Attempt

    host = (await _warmed(api_key, machine_token, settings, rig=60))["rig"]
    gate, held = _steps_held(monkeypatch)
    communicator = await _completion_sent(api_key, catalog.id, "x")
    offer = await host.recv_type("offer")
    assert held and not gate.is_set(), "offered before the step ran"
    await host.answer(offer, ["Hello", " there"])
    assert await communicator.receive_nothing(0.2), "no output before the step"
    gate.set()
    assert await _events(communicator) == (200, "Hello there")
    attempt = await Attempt.objects.aget(id=offer["job"])
    assert attempt.outcome == Attempt.Outcome.SUCCEEDED
    assert attempt.claimed_at is not None
    await host.close()


@postgresql_only
async def test_a_guess_the_claim_does_not_take_is_withdrawn(
    api_key, catalog, machine_token, settings
):
    """The noted device was paused after it was noted: it still gets the
    guessed offer, then its cancel; the claim takes the other device under
    another id, and what the guessed host streamed never reaches the renter
    or its record."""
    from hosts.models import Device
    from jobs.models import Attempt

    hosts = await _warmed(api_key, machine_token, settings, best=90, other=60)
    best, other = hosts["best"], hosts["other"]
    await Device.objects.filter(machine=best.machine).aupdate(paused=True)
    communicator = await _completion_sent(api_key, catalog.id, "x")
    guessed = await best.recv_type("offer")
    await best.answer(guessed, ["WRONG"])  # streams before its cancel arrives
    assert (await best.recv_type("cancel"))["job"] == guessed["job"]
    offer = await other.recv_type("offer")
    assert offer["job"] != guessed["job"]
    await other.answer(offer, ["right"])
    assert await _events(communicator) == (200, "right")
    # its frames that crossed the cancel were dropped without error frames
    assert await best.errors_within(0.2) == []
    assert not await Attempt.objects.filter(id=guessed["job"]).aexists()
    assert (
        not await Attempt.objects.filter(device__machine=best.machine)
        .exclude(job__status="succeeded")
        .aexists()
    )
    assert await Device.objects.filter(slots_used__gt=0).acount() == 0
    for host in hosts.values():
        await host.close()


@postgresql_only
async def test_a_claim_made_while_a_guess_is_out_waits_for_the_guess(
    api_key, catalog, machine_token, monkeypatch, settings
):
    """A guessed offer holds a host slot the database does not count: while it
    is out, another request's claim may take that slot. That offer reaches the
    host only once the guess is settled, after the withdrawn guess's cancel, so
    a one-slot host is never offered two jobs at once (it would refuse one and
    be blamed for it); the guessed request then waits for the slot."""

    host = (await _warmed(api_key, machine_token, settings, rig=60))["rig"]
    gate, _ = _steps_held(monkeypatch, first_only=True)
    guessed_request = await _completion_sent(api_key, catalog.id, "guessed")
    guessed = await host.recv_type("offer")
    claimed_request = await _completion_sent(api_key, catalog.id, "claimed")
    assert await host.ws.receive_nothing(timeout=0.3), "no offer while the guess is out"
    gate.set()  # the guessed step finds the slot taken: its job waits
    assert await host.recv() == {"type": "cancel", "job": guessed["job"]}
    offer = await host.recv_type("offer")
    assert offer["job"] != guessed["job"]
    await host.answer(offer, ["claimed"])
    assert await _events(claimed_request) == (200, "claimed")
    offer = await host.recv_type("offer")  # the freed slot goes to the waiting job
    await host.answer(offer, ["guessed"])
    assert await _events(guessed_request) == (200, "guessed")
    await host.close()


@postgresql_only
async def test_a_machine_reconnecting_during_its_guess_gets_the_offer_anew(
    api_key, catalog, machine_token, monkeypatch, settings
):
    """The guessed machine reconnects while the step is out: the claim takes
    its device on the new connection, so the guess (sent on the old one) is
    not confirmed; the job is offered on the new connection under another id
    and answered (not a 500)."""
    from tests.jobs.helpers import heartbeat_applied

    host = (await _warmed(api_key, machine_token, settings, rig=60))["rig"]
    gate, _ = _steps_held(monkeypatch)
    communicator = await _completion_sent(api_key, catalog.id, "x")
    guessed = await host.recv_type("offer")
    await host.close()
    await host.connect()
    await host.heartbeat()
    await heartbeat_applied(host.machine)
    gate.set()
    offer = await host.recv_type("offer")
    assert offer["job"] != guessed["job"]
    await host.answer(offer, ["again"])
    assert await _events(communicator) == (200, "again")
    await host.close()


@postgresql_only
async def test_a_host_that_paused_itself_is_not_guessed(
    api_key, catalog, machine_token, settings
):
    """The noted host says paused in a heartbeat: no guessed offer reaches it
    (its connection is not idle); the claim takes the other device."""
    from hosts.models import Machine

    hosts = await _warmed(api_key, machine_token, settings, best=90, other=60)
    best, other = hosts["best"], hosts["other"]
    await best.heartbeat(paused=True)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while not await Machine.objects.filter(
        id=best.machine.id, host_paused=True
    ).aexists():
        assert loop.time() < deadline, "the pause was never stored"
        await asyncio.sleep(0.01)
    communicator = await _completion_sent(api_key, catalog.id, "x")
    offer = await other.recv_type("offer")
    await other.answer(offer, ["right"])
    assert await _events(communicator) == (200, "right")
    assert await best.ws.receive_nothing(timeout=0.2), "no guessed offer"
    for host in hosts.values():
        await host.close()


@postgresql_only
async def test_a_refused_key_is_guessed_once_then_no_more(
    api_key, catalog, machine_token, settings
):
    """A trusted key revoked: its next request's guessed offer is withdrawn
    (401, nothing stored); the one after it is not guessed at all."""
    from jobs.models import ApiKey, Job

    host = (await _warmed(api_key, machine_token, settings, rig=60))["rig"]
    jobs_before = await Job.objects.acount()
    await ApiKey.objects.aupdate(revoked_at=timezone_now())
    communicator = await _completion_sent(api_key, catalog.id, "x")
    guessed = await host.recv_type("offer")
    assert (await host.recv_type("cancel"))["job"] == guessed["job"]
    status, _ = await _events(communicator)
    assert status == 401
    communicator = await _completion_sent(api_key, catalog.id, "x")
    status, _ = await _events(communicator)
    assert status == 401
    assert await host.ws.receive_nothing(timeout=0.2), "no second guess"
    assert await Job.objects.acount() == jobs_before
    await host.close()


@postgresql_only
async def test_a_busy_machine_is_not_guessed(
    api_key, catalog, machine_token, monkeypatch, settings
):
    """While the noted machine runs an attempt, a request's offer waits for
    its claim (a busy host might refuse an offer for a slot the claim frees
    later, and be blamed for it)."""
    from jobs import services
    from tests.jobs.helpers import heartbeat_applied

    host = (await _warmed(api_key, machine_token, settings, rig=60))["rig"]
    await host.heartbeat(slots=2)
    await heartbeat_applied(host.machine, slots=2)
    first = await _completion_sent(api_key, catalog.id, "one")
    running = await host.recv_type("offer")
    await host.claim(running["job"])
    await host.token(running["job"], "partly")
    await first.receive_output(5)  # the first token reached its renter
    # another answer ends meanwhile: the model's next pick is noted again
    filler = await _completion_sent(api_key, catalog.id, "filler")
    await host.answer(await host.recv_type("offer"), ["filler"])
    assert await _events(filler) == (200, "filler")
    assert services._next_picks, "a next pick is noted"
    gate, _ = _steps_held(monkeypatch)
    second = await _completion_sent(api_key, catalog.id, "two")
    assert await host.ws.receive_nothing(timeout=0.2), "no offer before the claim"
    gate.set()
    offer = await host.recv_type("offer")
    await host.answer(offer, ["two"])
    assert await _events(second) == (200, "two")
    await host.token(running["job"], " done")
    await host.done(running["job"], 2)
    await first.wait(5)
    await host.close()


@postgresql_only
async def test_a_step_failing_after_its_guessed_offer_withdraws_it(
    api_key, catalog, machine_token, monkeypatch, settings
):
    """The database step fails after the guessed offer left: the renter gets
    503 in OpenAI's shape and the host the offer's cancel."""
    from django.db import OperationalError

    from jobs import services

    host = (await _warmed(api_key, machine_token, settings, rig=60))["rig"]

    async def failing_step(self, *args):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(services._OpenStatement, "send_async", failing_step)
    communicator = await _completion_sent(api_key, catalog.id, "x")
    guessed = await host.recv_type("offer")
    assert (await host.recv_type("cancel"))["job"] == guessed["job"]
    status, body = await _events(communicator)
    assert status == 503 and "service_unavailable" in body
    await host.close()


def timezone_now():
    from django.utils import timezone

    return timezone.now()


@pytest_asyncio.fixture
async def relayed(monkeypatch):
    """``relayed(text)``: waits until the job's coroutine took ``text`` from its
    host (``JobRun._relayed``), so a test acts after a token reached the job."""
    from jobs.orchestration import JobRun

    taken: list[str] = []
    changed = asyncio.Event()
    real = JobRun._relayed

    def spy(self, text, size):
        taken.append(text)
        changed.set()
        return real(self, text, size)

    monkeypatch.setattr(JobRun, "_relayed", spy)

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
