"""DESIGN.md "When a host fails", before the first token: deadlines, failover, 502.

Scripted hosts (tests.hostsim) fail on purpose; deadlines are shortened through
the settings (``fast_deadlines``) and tests wait on frames, never on sleeps.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from channels.exceptions import ChannelFull

from ballast import local
from billing.models import Earning, LedgerTransaction
from billing.services import renter_balance_nano
from hosts.models import DeviceOutcome
from jobs.models import Attempt, Job

from .helpers import (
    chat_request,
    host_online,
    job_closed,
    read_body,
    sse_events,
    sse_text,
)
from .helpers import renter_ws as renter_ws_open

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def _attempts(job_id):
    return [
        a
        async for a in Attempt.objects.filter(job_id=job_id)
        .order_by("offered_at")
        .select_related("device__machine")
    ]


async def _fails_then_good_host(machine_token, api_key, misbehave):
    """Host ``bad`` (ranked first) misbehaves; host ``good`` answers. Returns job + text."""
    bad = await host_online(machine_token, "bad", score=90)
    good = await host_online(machine_token, "good", score=60)
    request = chat_request(api_key)
    offer = await bad.recv_type("offer")
    await misbehave(bad, offer)
    second = await good.recv_type("offer")
    assert second["job"] != offer["job"]
    assert second["continue_from"] == ""
    await good.answer(second, ["Hello", " there"])
    response = await request
    assert response.status_code == 200
    text = sse_text(sse_events(await read_body(response)))
    job_id = response["x-ballast-job-id"]
    cancel = await bad.recv_type("cancel")
    assert cancel["job"] == offer["job"], "the failed host is told to stop"
    await bad.close()
    await good.close()
    return job_id, text


async def _never_claims(host, offer):
    pass


async def _claims_then_silent(host, offer):
    await host.claim(offer["job"])


async def _sends_error(host, offer):
    await host.claim(offer["job"])
    await host.send(
        {"type": "error", "job": offer["job"], "message": "CUDA out of memory"}
    )


async def _empty_done(host, offer):
    await host.claim(offer["job"])
    await host.done(offer["job"], 0)


async def _refuses_offer(host, offer):
    await host.send({"type": "error", "job": offer["job"], "message": "no free slot"})


async def _error_with_nul(host, offer):
    """An error whose message PostgreSQL text cannot hold (a NUL) and that is not
    UTF-8 (a lone surrogate): still the host's error, never the coordinator's."""
    await host.claim(offer["job"])
    await host.send({"type": "error", "job": offer["job"], "message": "bad\x00\ud800"})


async def _error_not_text(host, offer):
    await host.claim(offer["job"])
    await host.send({"type": "error", "job": offer["job"], "message": {"no": 1}})


async def _malformed_token(host, offer):
    await host.claim(offer["job"])
    await host.send({"type": "token", "job": offer["job"], "text": 7})


async def _malformed_done(host, offer):
    await host.claim(offer["job"])
    await host.send({"type": "done", "job": offer["job"], "usage": "lots"})


async def _empty_done_unexplained(host, offer):
    """An empty done to a request with no stop sequence and room for characters."""
    await host.claim(offer["job"])
    await host.done(offer["job"], 0)


@pytest.mark.parametrize(
    "misbehave, outcome",
    [
        (_never_claims, "claim_timeout"),
        (_claims_then_silent, "first_token_timeout"),
        (_sends_error, "host_error"),
        (_refuses_offer, "host_error"),
        (_error_with_nul, "host_error"),
        (_error_not_text, "host_error"),
        (_malformed_token, "host_error"),
        (_malformed_done, "host_error"),
        (_empty_done_unexplained, "empty_answer"),
    ],
    ids=[
        "never claims",
        "claims then silent",
        "error frame",
        "refuses",
        "error with NUL and a lone surrogate",
        "error message not text",
        "malformed token",
        "malformed done",
        "empty done",
    ],
)
async def test_it_fails_over_before_the_first_token(
    catalog, api_key, machine_token, fast_deadlines, misbehave, outcome
):
    job_id, text = await _fails_then_good_host(machine_token, api_key, misbehave)
    assert text == "Hello there", "the renter sees one reply"
    attempts = await _attempts(job_id)
    assert [a.outcome for a in attempts] == [outcome, "succeeded"]
    assert (
        attempts[0].device.machine.name == "bad"
        and attempts[1].device.machine.name == "good"
    )
    job = await Job.objects.aget(id=job_id)
    assert job.status == Job.Status.SUCCEEDED and job.failed_over is False
    bad_device = attempts[0].device
    await bad_device.arefresh_from_db()
    assert bad_device.slots_used == 0, "the failed attempt's slot is freed"
    assert bad_device.score < 60, "the failure lowers the device's standing"
    assert await DeviceOutcome.objects.filter(
        device=bad_device, success=False, reason=outcome
    ).aexists()
    assert not await Earning.objects.filter(attempt=attempts[0]).aexists()


async def test_an_empty_done_the_request_explains_is_not_counted_against_the_device(
    catalog, api_key, machine_token, fast_deadlines
):
    """Never an empty success; but a request with a stop sequence can make an
    honest model answer nothing (``empty_answer_explained``): that failure is not
    the device's, and a renter cannot sink honest hosts' scores with it."""
    bad = await host_online(machine_token, "bad", score=90)
    good = await host_online(machine_token, "good", score=60)
    request = chat_request(api_key, stop=["\n"])
    offer = await bad.recv_type("offer")
    await _empty_done(bad, offer)
    second = await good.recv_type("offer")
    await good.answer(second, ["Hello", " there"])
    response = await request
    assert sse_text(sse_events(await read_body(response))) == "Hello there"
    attempts = await _attempts(response["x-ballast-job-id"])
    assert [a.outcome for a in attempts] == ["empty_answer", "succeeded"]
    bad_device = attempts[0].device
    await bad_device.arefresh_from_db()
    assert bad_device.slots_used == 0
    assert bad_device.score == 90, "the score the test gave it, untouched"
    assert not await DeviceOutcome.objects.filter(device=bad_device).aexists()
    assert not await Earning.objects.filter(attempt=attempts[0]).aexists()
    await bad.close()
    await good.close()


async def test_it_answers_502_and_bills_nothing_when_every_attempt_fails(
    catalog, api_key, renter, machine_token, fast_deadlines, settings
):
    settings.BALLAST_MAX_ATTEMPTS = 3
    hosts = [
        await host_online(machine_token, f"bad{i}", score=90 - i) for i in range(3)
    ]
    spare = await host_online(machine_token, "spare", score=10)
    balance = await _balance(renter)
    request = chat_request(api_key)
    seen = set()
    for host in hosts:
        offer = await host.recv_type("offer")
        assert offer["job"] not in seen, "never the same attempt twice"
        seen.add(offer["job"])
        await host.send({"type": "error", "job": offer["job"], "message": "boom"})
    response = await request
    assert response.status_code == 502
    body = json.loads(response.content)
    assert body["error"]["code"] == "all_attempts_failed"
    assert await spare.ws.receive_nothing(timeout=0.3), "no fourth attempt"
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert (
        job.status == Job.Status.FAILED
        and job.cost_nano == 0
        and job.tokens_billed == 0
    )
    assert await _balance(renter) == balance
    assert not await LedgerTransaction.objects.filter(job=job).aexists()
    devices = {a.device_id for a in await _attempts(job.id)}
    assert len(devices) == 3
    for host in [*hosts, spare]:
        await host.close()


async def test_the_only_device_failing_before_output_is_a_502_not_no_capacity(
    catalog, api_key, machine_token, fast_deadlines
):
    """PROTOCOL.md: 502 when every attempt failed before any output; 503 is for
    a request no live device could take at all (found by a fresh-eyes check:
    the one agent killed before its first token gave 503 ``no_capacity``)."""
    host = await host_online(machine_token, "only")
    request = chat_request(api_key, stream=False)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.close()  # gone before its first token; no other device
    response = await request
    body = json.loads(response.content)
    assert (response.status_code, body["error"]["code"]) == (
        502,
        "all_attempts_failed",
    ), body
    assert "1 attempt(s) failed" in body["error"]["message"]
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert job.status == Job.Status.FAILED and job.cost_nano == 0


async def _balance(user):
    from channels.db import database_sync_to_async

    return await database_sync_to_async(renter_balance_nano)(user=user)


async def test_it_ignores_late_frames_of_a_failed_attempt(
    catalog, api_key, machine_token, fast_deadlines
):
    bad = await host_online(machine_token, "bad", score=90)
    good = await host_online(machine_token, "good", score=60)
    request = chat_request(api_key, stream=False)
    offer = await bad.recv_type("offer")
    second = await good.recv_type("offer")  # the bad host missed its claim deadline
    await good.answer(second, ["Fine"])
    response = await request
    assert json.loads(response.content)["choices"][0]["message"]["content"] == "Fine"
    await bad.recv_type("cancel")
    # the slow host wakes up and sends everything late
    await bad.claim(offer["job"])
    await bad.token(offer["job"], "late text")
    await bad.done(offer["job"], 2)
    # it was told to cancel: its late frames are dropped without error frames
    assert await bad.errors_within(0.2) == []
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    attempts = await _attempts(job.id)
    assert attempts[0].outcome == "claim_timeout" and attempts[0].output_chars == 0
    assert job.output_text == "Fine"
    assert await LedgerTransaction.objects.filter(job=job).acount() == 1
    assert await Earning.objects.filter(attempt__job=job).acount() == 1
    await bad.close()
    await good.close()


async def test_it_frees_the_slot_and_cancels_when_the_renter_goes_away(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "rig")
    renter_ws = await renter_ws_open(api_key, "Count")
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], "One,")
    chunk = await renter_ws.receive_json_from(timeout=5)
    assert chunk["choices"][0]["delta"]["content"] == "One,"
    await renter_ws.disconnect()
    cancel = await host.recv_type("cancel")
    assert cancel["job"] == offer["job"]
    await host.cancelled(offer["job"])  # its receipt (docs/protocol-notes.md)
    attempt = await Attempt.objects.select_related("job", "device").aget(
        id=offer["job"]
    )
    await job_closed(attempt.job_id)
    attempt = await Attempt.objects.select_related("job", "device").aget(
        id=offer["job"]
    )
    assert attempt.outcome == "cancelled" and attempt.device.slots_used == 0
    assert attempt.job.status == Job.Status.CANCELLED
    assert attempt.job.output_text == "One,"
    assert attempt.job.tokens_billed >= 1, "billing covers what was delivered"
    assert not await DeviceOutcome.objects.filter(device=attempt.device).aexists(), (
        "a renter's cancel is not an outcome"
    )
    await host.close()


async def _renter_gone_after_one_token(api_key, host) -> dict:
    """A renter's stream on ``host`` that goes away after its first token;
    returns the offer."""
    renter_ws = await renter_ws_open(api_key, "Count")
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], "One,")
    await renter_ws.receive_json_from(timeout=5)
    await renter_ws.disconnect()
    return offer


async def test_frames_crossing_a_cancel_are_dropped_quietly_others_answered(
    catalog, api_key, machine_token
):
    """After the coordinator cancels an attempt, the host's frames of it that
    were already on their way get no error frames (they crossed the cancel);
    a frame for a job never offered here still gets one."""
    host = await host_online(machine_token, "rig")
    offer = await _renter_gone_after_one_token(api_key, host)
    await _frames_crossing_the_cancel_answered(host, offer)
    await host.close()


async def _frames_crossing_the_cancel_answered(host, offer) -> None:
    """The host reads the cancel of ``offer``, sends frames of it that crossed
    the cancel and one of a job never offered: only that one gets an error."""
    assert (await host.recv_type("cancel"))["job"] == offer["job"]
    await host.token(offer["job"], " two,")
    await host.done(offer["job"], 2)
    await host.token("never-offered", "x")
    # the first error frame is the stranger's (another cancel may come between)
    error = await host.recv_type("error")
    assert "never-offered" in error["message"], error


async def test_frames_crossing_a_cancel_of_the_claims_record_are_dropped_quietly(
    catalog, api_key, machine_token, monkeypatch
):
    """The attempt ended before the host's claim was recorded (the renter went
    away): the record finds it ended and the connection cancels it on the host
    before the job's own cancel arrives; the host's frames of it on their way
    get no error frames either."""
    from jobs import services as job_services

    recorded = asyncio.Event()

    def claim_too_late(**kwargs) -> bool:
        recorded.set()
        return False  # as when the attempt was ended first

    monkeypatch.setattr(job_services, "attempt_claim", claim_too_late)
    host = await host_online(machine_token, "rig")
    renter_ws = await renter_ws_open(api_key, "Count")
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], "One,")
    await asyncio.wait_for(recorded.wait(), 5)
    await _frames_crossing_the_cancel_answered(host, offer)
    await renter_ws.disconnect()
    await host.close()


def _service_held(monkeypatch, name: str) -> tuple[threading.Event, threading.Event]:
    """Hold ``jobs.services.<name>`` in its worker thread until released:
    (entered, release); the real function runs once ``release`` is set."""
    from jobs import services as job_services

    entered, release = threading.Event(), threading.Event()
    real = getattr(job_services, name)

    def held(**kwargs):
        entered.set()
        release.wait(10)
        return real(**kwargs)

    monkeypatch.setattr(job_services, name, held)
    return entered, release


async def _answer_begun(machine_token, api_key, text: str):
    """A host online, a renter's request on its websocket, the host's claim and
    first token ``text``: (host, renter websocket, offer)."""
    host = await host_online(machine_token, "rig")
    renter_ws = await renter_ws_open(api_key, "Count")
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], text)
    return host, renter_ws, offer


async def _renter_gone_during(entered, release, renter_ws, attempt_id: str) -> Job:
    """Once the held step began, the renter goes away, the step goes on; the
    job of ``attempt_id`` once it is closed."""
    assert await asyncio.to_thread(entered.wait, 10), "the held step never began"
    await renter_ws.disconnect()
    release.set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    jobs = Job.objects.filter(attempts__id=attempt_id)
    while await jobs.filter(status__in=Job.OPEN_STATUSES).aexists():
        assert loop.time() < deadline, "the job was left open"
        await asyncio.sleep(0.01)
    return await jobs.aget()


async def test_a_renter_gone_as_the_answer_completes_is_billed_for_it(
    catalog, api_key, machine_token, monkeypatch
):
    """The renter goes away while the end of an answer its host completed is
    being recorded: that end still records the success (the text billed, the
    host paid), not a cancel of an attempt with no text."""
    held = _service_held(monkeypatch, "job_succeed")
    host, renter_ws, offer = await _answer_begun(machine_token, api_key, "One, two.")
    await host.done(offer["job"], 3)
    job = await _renter_gone_during(*held, renter_ws, offer["job"])
    attempt = await Attempt.objects.aget(id=offer["job"])
    assert (job.status, job.tokens_billed) == (Job.Status.SUCCEEDED, 3)
    assert (attempt.outcome, attempt.output_text) == ("succeeded", "One, two.")
    assert await LedgerTransaction.objects.filter(job=job).aexists()
    assert await Earning.objects.filter(attempt=attempt).aexists()
    await host.close()


async def test_a_renter_gone_while_a_failed_attempt_is_recorded_is_billed_for_it(
    catalog, api_key, machine_token, monkeypatch
):
    """The host fails mid-answer and the renter goes away while that attempt's
    end is being recorded: the attempt keeps the text the renter had (billed),
    rather than being ended with none by the job's close."""
    held = _service_held(monkeypatch, "attempt_end")
    host, renter_ws, offer = await _answer_begun(machine_token, api_key, "One, two,")
    await renter_ws.receive_json_from(timeout=5)
    await host.send({"type": "error", "job": offer["job"], "message": "out of memory"})
    job = await _renter_gone_during(*held, renter_ws, offer["job"])
    attempt = await Attempt.objects.aget(id=offer["job"])
    assert attempt.output_text == "One, two,"
    assert attempt.tokens_billed > 0 and job.tokens_billed == attempt.tokens_billed
    await host.close()


async def test_the_job_still_closes_when_the_hosts_cancel_cannot_be_sent(
    catalog, api_key, machine_token, monkeypatch
):
    real_send = local.channel_send

    async def send_refusing_cancels(layer, channel, message):
        if message["type"] == "attempt.cancel":
            raise ChannelFull("the machine's inbox is full")
        await real_send(layer, channel, message)

    monkeypatch.setattr(local, "channel_send", send_refusing_cancels)
    host = await host_online(machine_token, "rig")
    offer = await _renter_gone_after_one_token(api_key, host)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while (
        await Job.objects.filter(attempts__id=offer["job"])
        .values_list("status", flat=True)
        .aget()
        != Job.Status.CANCELLED
    ):
        assert loop.time() < deadline, "the job was left open"
        await asyncio.sleep(0.01)
    attempt = await Attempt.objects.select_related("device").aget(id=offer["job"])
    assert attempt.outcome == "cancelled" and attempt.device.slots_used == 0
    await host.close()


async def test_it_answers_the_renter_websocket_with_chunks_then_done(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "rig")
    renter_ws = await renter_ws_open(api_key, "Hi")
    offer = await host.recv_type("offer")
    await host.answer(offer, ["Hi", "!"])
    messages = []
    while True:
        message = await renter_ws.receive_json_from(timeout=5)
        messages.append(message)
        if message.get("type") == "done":
            break
    assert (
        "".join(m["choices"][0]["delta"].get("content", "") for m in messages[:-1])
        == "Hi!"
    )
    assert messages[-2]["choices"][0]["finish_reason"] == "stop"
    assert (
        messages[-1]["finish_reason"] == "stop"
        and messages[-1]["usage"]["completion_tokens"] > 0
    )
    await renter_ws.disconnect()
    await host.close()


async def test_it_refuses_a_renter_websocket_without_a_valid_key(catalog):
    from channels.testing import WebsocketCommunicator

    from ballast.asgi import application

    ws = WebsocketCommunicator(
        application, "/ws/v1/chat/", headers=[(b"authorization", b"Bearer nope")]
    )
    connected, _ = await ws.connect()
    assert connected, (
        "accepted, to say why in a message (a refused handshake is a bare 403)"
    )
    error = await ws.receive_json_from(timeout=5)
    assert error["type"] == "error" and error["status"] == 401
    assert error["error"]["code"] == "invalid_api_key"
    assert (await ws.receive_output(timeout=5)) == {
        "type": "websocket.close",
        "code": 4401,
    }


async def test_the_renter_websocket_answers_bad_json_and_a_lost_database_with_status(
    catalog, api_key, monkeypatch
):
    """Every error message of the renter websocket names its status; the
    coordinator's own failure is an error message too, not a silent socket."""
    from channels.testing import WebsocketCommunicator
    from django.db import OperationalError

    from ballast.asgi import application
    from jobs import consumers

    ws = WebsocketCommunicator(
        application,
        "/ws/v1/chat/",
        headers=[(b"authorization", f"Bearer {api_key}".encode())],
    )
    assert (await ws.connect())[0]
    await ws.send_to(text_data="{not json")
    error = await ws.receive_json_from(timeout=5)
    assert (error["type"], error["status"], error["error"]["code"]) == (
        "error",
        400,
        "invalid_json",
    )
    await ws.send_to(bytes_data=b'{"model": "m"}')
    error = await ws.receive_json_from(timeout=5)
    assert error["status"] == 400 and "text message" in error["error"]["message"]

    def lost(**kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(consumers.renter, "job_open", lost)
    await ws.send_json_to(
        {"model": catalog.id, "messages": [{"role": "user", "content": "Hi"}]}
    )
    error = await ws.receive_json_from(timeout=5)
    assert (error["status"], error["error"]["code"]) == (503, "service_unavailable")
    await ws.disconnect()
