"""DESIGN.md "Spot checks (canaries)": when they are sent, that the host cannot tell
them apart, how they are judged, and what a failure costs the device."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from billing.models import Earning, LedgerTransaction
from hosts.models import Device, DeviceOutcome, Machine
from hosts.services import spot_check_mark_due
from jobs.models import Job, SpotCheck
from jobs.spotchecks import spot_checks_schedule
from tests.hostsim import HostSim

from .helpers import chat_request, host_online

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

ANSWERS = {
    "What is 2+2?": "2+2 is 4.",
    "What is the capital of Japan?": "The capital of Japan is Tokyo.",
    "What is the opposite of hot?": "The opposite of hot is cold.",
    "What is 7+3?": "7 + 3 = 10.",
    "Who wrote Romeo and Juliet?": "William Shakespeare wrote it.",
    "What is 6 times 7?": "6 times 7 is 42.",
    "What is the capital of Germany?": "Berlin.",
    "What is the opposite of up?": "Down.",
}


async def _verdict(offer_job: str) -> SpotCheck:
    """Wait (on the database state) until the spot check of this attempt is judged."""
    for _ in range(200):
        check = await SpotCheck.objects.filter(job__attempts__id=offer_job).afirst()
        if check is not None and check.passed is not None:
            return check
        await asyncio.sleep(0.02)
    raise AssertionError("spot check never judged")


async def _due(device_id: int, reason: str = "staff") -> None:
    await database_sync_to_async(spot_check_mark_due)(
        device_id=device_id, reason=reason
    )


async def _device(host: HostSim) -> Device:
    return await Device.objects.aget(machine=host.machine)


async def test_it_checks_a_device_when_a_model_first_loads(canaries, machine_token):
    host = await host_online(
        machine_token, "rig"
    )  # the first heartbeat loads the model
    offer = await host.recv_type("offer")
    await host.answer(offer, [ANSWERS[offer["messages"][0]["content"]]])
    check = await _verdict(offer["job"])
    assert check.reason == "first_load" and check.passed is True
    job = await Job.objects.aget(id=check.job_id)
    assert job.is_spot_check and job.cost_nano == 0
    assert not await LedgerTransaction.objects.filter(job=job).aexists(), "never billed"
    assert await DeviceOutcome.objects.filter(
        device_id=check.device_id, source="spot_check", success=True
    ).aexists()
    await host.close()


async def _first_load_check(host: HostSim) -> None:
    offer = await host.recv_type("offer")
    await host.answer(offer, [ANSWERS[offer["messages"][0]["content"]]])
    await _verdict(offer["job"])


async def test_a_wrong_answer_fails_and_reverses_held_earnings(
    canaries, api_key, machine_token
):
    host = await host_online(machine_token, "rig")
    await _first_load_check(host)
    request = chat_request(api_key, stream=False)
    offer = await host.recv_type("offer")
    await host.answer(offer, ["Happy to help."])
    assert (await request).status_code == 200
    earning = await Earning.objects.aget(attempt_id=offer["job"])
    assert earning.status == "held"
    device = await _device(host)
    before = device.score
    await _due(device.id)
    await host.heartbeat()
    canary = await host.recv_type("offer")
    await host.answer(canary, ["I think the answer is purple."])
    check = await _verdict(canary["job"])
    assert check.passed is False and "expected answer missing" in check.detail
    await earning.arefresh_from_db()
    assert earning.status == "reversed"
    assert await LedgerTransaction.objects.filter(kind="earning_reversal").acount() == 1
    assert await DeviceOutcome.objects.filter(
        device_id=device.id, source="spot_check", success=False
    ).aexists(), "the failed check is an outcome of the score"
    await device.arefresh_from_db()
    # (not always strictly lower here: a new device's uptime part can grow between
    # the two recomputes by as much as one failure in three outcomes takes away;
    # tests/hosts/test_score.py holds the score's rule)
    assert device.score <= before
    await host.close()


async def test_an_inflated_token_count_fails_the_check(canaries, machine_token):
    host = await host_online(machine_token, "rig")
    offer = await host.recv_type("offer")
    text = ANSWERS[offer["messages"][0]["content"]]
    await host.answer(offer, [text], tokens=len(text) + 5)
    check = await _verdict(offer["job"])
    assert check.passed is False and "unbelievable token count" in check.detail
    await host.close()


async def test_a_canary_offer_looks_like_a_renters(canaries, api_key, machine_token):
    host = await host_online(machine_token, "rig")
    canary = await host.recv_type("offer")
    await host.answer(canary, [ANSWERS[canary["messages"][0]["content"]]])
    await _verdict(canary["job"])
    request = chat_request(
        api_key, stream=False, content="What is 2+2?", temperature=0, max_tokens=64
    )
    real = await host.recv_type("offer")
    await host.answer(real, ["4"])
    await request

    def shape(value):
        if isinstance(value, dict):
            return {k: shape(v) for k, v in sorted(value.items())}
        if isinstance(value, list):
            return [shape(v) for v in value]
        return type(value).__name__

    assert shape(canary) == shape(real)
    assert (
        str(uuid.UUID(canary["job"])) == canary["job"]
        and str(uuid.UUID(real["job"])) == real["job"]
    )
    assert canary["params"] == real["params"]
    assert canary["continue_from"] == real["continue_from"] == ""
    assert canary["messages"][0]["role"] == real["messages"][0]["role"] == "user"
    await host.close()


async def test_a_device_never_gets_the_same_canary_twice(canaries, machine_token):
    host = await host_online(machine_token, "rig")
    device = await _device(host)
    prompts = []
    for _ in range(len(canaries)):
        offer = await host.recv_type("offer")
        prompts.append(offer["messages"][0]["content"])
        await host.answer(offer, [ANSWERS[prompts[-1]]])
        await _verdict(offer["job"])
        await _due(device.id)
        await host.heartbeat()
    assert len(set(prompts)) == len(canaries)
    assert await host.ws.receive_nothing(timeout=0.3), "no canary left: nothing is sent"
    await host.close()


async def test_a_quarantined_device_gets_only_spot_checks_until_three_pass(
    canaries, api_key, machine_token, settings
):
    settings.BALLAST_QUEUE_TIMEOUT_S = 0.5
    host = await host_online(machine_token, "rig")
    device = await _device(host)
    for _ in range(3):  # three failed checks: quarantined
        offer = await host.recv_type("offer")
        await host.answer(offer, ["No idea."])
        await _verdict(offer["job"])
        await _due(device.id)
        await host.heartbeat()
    await device.arefresh_from_db()
    assert device.quarantined
    # while quarantined, a renter's request is never offered here: it times out
    response = await chat_request(api_key, stream=False)
    assert response.status_code == 504, "a quarantined device takes no renter job"
    offers = []
    for _ in range(3):  # spot checks only; three passes in a row release it
        offer = await host.recv_type("offer")
        offers.append(offer["messages"][0]["content"])
        await host.answer(offer, [ANSWERS[offers[-1]]])
        await _verdict(offer["job"])
        await device.arefresh_from_db()
        if device.quarantined:
            await _due(device.id)
            await host.heartbeat()
    assert all(prompt in ANSWERS for prompt in offers)
    await device.arefresh_from_db()
    assert not device.quarantined, "3 passes in a row release it"
    await host.close()


async def test_it_marks_a_check_on_about_the_canary_rate_of_jobs(
    catalog, api_key, machine_token, settings
):
    settings.BALLAST_CANARY_RATE = 1.0
    settings.BALLAST_SPOT_CHECK_MAX_DELAY_S = 600
    host = await host_online(machine_token, "rig")
    device = await _device(host)
    await Device.objects.filter(id=device.id).aupdate(spot_check_due_at=None)
    request = chat_request(api_key, stream=False)
    offer = await host.recv_type("offer")
    await host.answer(offer, ["ok"])
    await request
    await device.arefresh_from_db()
    assert device.spot_check_reason == "rate" and device.spot_check_due_at is not None
    settings.BALLAST_CANARY_RATE = 0.0
    await Device.objects.filter(id=device.id).aupdate(
        spot_check_due_at=None, spot_check_reason=""
    )
    request = chat_request(api_key, stream=False)
    offer = await host.recv_type("offer")
    await host.answer(offer, ["ok"])
    await request
    await device.arefresh_from_db()
    assert device.spot_check_due_at is None
    await host.close()


async def test_it_checks_a_device_back_after_more_than_10_minutes(
    canaries, machine_token
):
    host = await host_online(machine_token, "rig")
    await _first_load_check(host)
    await host.close()
    await Machine.objects.filter(id=host.machine.id).aupdate(
        last_heartbeat_at=timezone.now() - timedelta(minutes=11)
    )
    again = HostSim(host.machine_token)
    again.key = host.key
    await again.connect()
    await again.heartbeat()
    offer = await again.recv_type("offer")
    await again.answer(offer, [ANSWERS[offer["messages"][0]["content"]]])
    check = await _verdict(offer["job"])
    assert check.reason == "return" and check.passed
    await again.close()


async def test_beat_marks_checks_for_quarantined_devices(
    canaries, machine_token, settings
):
    settings.BALLAST_QUARANTINE_CHECK_EVERY_S = 0
    host = await host_online(machine_token, "rig")
    await _first_load_check(host)
    device = await _device(host)
    await Device.objects.filter(id=device.id).aupdate(
        quarantined=True, spot_check_due_at=None
    )
    assert await database_sync_to_async(spot_checks_schedule)() == 1
    await device.arefresh_from_db()
    assert device.spot_check_reason == "quarantine"
    await host.close()
