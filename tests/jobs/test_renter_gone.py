"""DESIGN.md "When a host fails", the renter's side: a renter that goes away
cancels its job on the host, frees the slot and is billed for what it was
delivered; host frames that crossed the cancel are dropped quietly.

Scripted hosts (tests.hostsim); tests wait on frames and rows, never on sleeps.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from channels.exceptions import ChannelFull

from ballast import local
from billing.models import Earning, LedgerTransaction
from hosts.models import DeviceOutcome
from jobs.models import Attempt, Job

from .helpers import host_online, job_closed
from .helpers import renter_ws as renter_ws_open

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


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
