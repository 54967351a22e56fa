"""DESIGN.md "Spot checks (canaries)": when they are sent, that the host cannot tell
them apart, how they are judged, and what a failure costs the device."""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.test import AsyncClient
from django.urls import reverse
from django.utils import timezone

from agent.engines.scripted import ScriptedEngine
from billing.models import Earning, Entry, LedgerTransaction
from billing.money import share_of
from hosts.models import Device, DeviceOutcome, Machine
from hosts.services import spot_check_mark_due
from jobs.models import Job, SpotCheck
from tests.conftest import oracle_answer
from tests.hostsim import HostSim
from tests.jobs.helpers import chat_request, host_online, right_answer, verdict
from trust.canarypool import canary_pool_fill, canary_pool_top_up
from trust.spotchecks import spot_checks_schedule

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

async def _verdict(offer_job: str) -> SpotCheck:
    return await verdict(offer_job)


async def _due(device_id: int, reason: str = "staff") -> None:
    await database_sync_to_async(spot_check_mark_due)(
        device_id=device_id, reason=reason
    )


async def _device(host: HostSim) -> Device:
    return await Device.objects.aget(machine=host.machine)


async def test_it_checks_a_device_when_a_model_first_loads_and_pays_it_like_a_job(
    canaries, machine_token
):
    host = await host_online(
        machine_token, "rig"
    )  # the first heartbeat loads the model
    offer = await host.recv_type("offer")
    await host.answer(offer, [await right_answer(offer)])
    check = await _verdict(offer["job"])
    assert check.reason == "first_load" and check.passed is True
    job = await Job.objects.aget(id=check.job_id)
    assert job.is_spot_check and job.cost_nano == 0 and job.tokens_billed > 0
    earning = await Earning.objects.aget(attempt_id=offer["job"])
    assert earning.status == "held"
    assert earning.amount_nano == share_of(
        job.tokens_billed * job.price_completion_nano, settings.BALLAST_HOST_SHARE
    ), "paid as a renter's job of that length would pay"
    legs = {
        e.account.kind: e.amount_nano
        async for e in Entry.objects.filter(transaction__job=job).select_related(
            "account"
        )
    }
    assert legs == {
        "host_held": earning.amount_nano,
        "platform_checks": -earning.amount_nano,
    }, "paid by the platform; nobody billed"
    assert await DeviceOutcome.objects.filter(
        device_id=check.device_id, source="spot_check", success=True
    ).aexists()
    await host.close()


async def _first_load_check(host: HostSim) -> None:
    offer = await host.recv_type("offer")
    await host.answer(offer, [await right_answer(offer)])
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
    # the renter's job, the first-load check and this check itself: each was paid
    assert await Earning.objects.filter(status="reversed").acount() == 3
    assert await LedgerTransaction.objects.filter(kind="earning_reversal").acount() == 3
    assert not await Earning.objects.filter(status="held").aexists()
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
    text = await right_answer(offer)
    await host.answer(offer, [text], tokens=len(text) + 5)
    check = await _verdict(offer["job"])
    assert check.passed is False and "unbelievable token count" in check.detail
    await host.close()


def _shape(value):
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return type(value).__name__


async def test_a_canary_offer_is_drawn_in_the_shape_of_real_traffic(
    catalog, api_key, machine_token, settings
):
    settings.BALLAST_SPOT_CHECKS = True
    settings.BALLAST_SPOT_CHECK_MAX_DELAY_S = 0
    settings.BALLAST_CANARY_RATE = 0
    settings.BALLAST_HEARTBEAT_INTERVAL_S = settings.BALLAST_HEARTBEAT_MAX_AGE_S / 2
    host = await host_online(machine_token, "rig")  # no pool yet: no check sent
    real_messages = [
        {"role": "system", "content": "You answer in one line."},
        {"role": "user", "content": "Hi, I need help with my order."},
        {"role": "assistant", "content": "Of course. What is the problem?"},
        {"role": "user", "content": "It has not arrived yet."},
    ]
    request = chat_request(
        api_key,
        stream=False,
        messages=real_messages,
        max_tokens=77,
        top_p=0.9,
        stop=["END"],
        seed=1234,
    )
    real = await host.recv_type("offer")
    await host.answer(real, ["Let me check that for you."])
    assert (await request).status_code == 200
    # the pool is drawn now, in the shape of the one real job
    await database_sync_to_async(canary_pool_fill)(
        model_id=catalog.id, keep=2, answer=oracle_answer
    )
    device = await _device(host)
    await _due(device.id)
    await host.heartbeat()
    canary = await host.recv_type("offer")
    await host.answer(canary, [await right_answer(canary)])
    assert (await _verdict(canary["job"])).passed
    assert _shape(canary) == _shape(real)
    assert str(uuid.UUID(canary["job"])) == canary["job"]
    assert canary["params"] == {**real["params"], "temperature": 0}
    assert canary["continue_from"] == real["continue_from"] == ""
    assert [m["role"] for m in canary["messages"]] == [
        m["role"] for m in real_messages
    ]
    assert canary["messages"] != real_messages, "its own words, never a renter's"
    await host.close()


async def _answer_checks(host: HostSim, device: Device, count: int, *, right=True):
    """Answer ``count`` spot checks in a row (each marked due after the last is
    judged), topping the pool up (``oracle_answer`` standing in for the model)
    as the beat does; returns the prompts offered."""
    prompts = []
    for _ in range(count):
        await database_sync_to_async(canary_pool_top_up)(
            engine_for=lambda model_id: ScriptedEngine({"models": [model_id]}),
            answerer_for=lambda engine: oracle_answer,
        )
        offer = await host.recv_type("offer")
        prompts.append(json.dumps(offer.get("messages") or offer.get("prompt")))
        await host.answer(offer, [await right_answer(offer) if right else "No idea."])
        await _verdict(offer["job"])
        await device.arefresh_from_db()
        await _due(device.id)
        await host.heartbeat()
    return prompts


async def test_the_pool_never_runs_out_and_a_device_never_gets_a_canary_twice(
    canaries, machine_token, settings
):
    settings.BALLAST_CANARY_POOL_AHEAD = 3
    host = await host_online(machine_token, "rig")
    device = await _device(host)
    prompts = await _answer_checks(host, device, 3 * len(canaries))
    assert len(set(prompts)) == len(prompts) == 3 * len(canaries)
    assert await SpotCheck.objects.filter(device=device, passed=True).acount() == len(
        prompts
    ), "still checked after more checks than the pool first held"
    await host.close()


async def test_a_check_the_pool_cannot_serve_yet_is_sent_once_it_is_topped_up(
    catalog, machine_token, settings
):
    settings.BALLAST_SPOT_CHECKS = True
    settings.BALLAST_SPOT_CHECK_MAX_DELAY_S = 0
    settings.BALLAST_HEARTBEAT_INTERVAL_S = settings.BALLAST_HEARTBEAT_MAX_AGE_S / 2
    settings.BALLAST_CANARY_POOL_AHEAD = 1
    host = await host_online(machine_token, "rig")  # empty pool: nothing sent
    device = await _device(host)
    assert await host.ws.receive_nothing(timeout=0.2)
    await device.arefresh_from_db()
    assert device.spot_check_reason == "first_load", "the check is still due"
    await database_sync_to_async(canary_pool_top_up)(
        engine_for=lambda model_id: ScriptedEngine({"models": [model_id]}),
        answerer_for=lambda engine: oracle_answer,
    )
    await host.heartbeat()
    offer = await host.recv_type("offer")
    await host.answer(offer, [await right_answer(offer)])
    check = await _verdict(offer["job"])
    assert check.reason == "first_load" and check.passed
    await host.close()


async def test_a_quarantined_device_gets_only_spot_checks_until_three_pass(
    canaries, api_key, machine_token, settings
):
    """However many checks it had: more than the pool first held, here."""
    settings.BALLAST_QUEUE_TIMEOUT_S = 0.5
    settings.BALLAST_CANARY_POOL_AHEAD = 2
    host = await host_online(machine_token, "rig")
    device = await _device(host)
    await _answer_checks(host, device, len(canaries) + 2)
    for _ in range(3):  # three failed checks: quarantined
        await _answer_checks(host, device, 1, right=False)
    assert device.quarantined
    # while quarantined, a renter's request is never offered here: it times out
    response = await chat_request(api_key, stream=False)
    assert response.status_code == 504, "a quarantined device takes no renter job"
    await _answer_checks(host, device, 2)
    assert device.quarantined, "two passes are not enough"
    await _answer_checks(host, device, 1)
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
    await again.answer(offer, [await right_answer(offer)])
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


def _rows(html: str, after: str) -> list[str]:
    """The table rows of the first ``<tbody>`` after ``after``, with every number,
    id and time made alike (what a check and a job may differ in: their values)."""
    body = html[html.index(after) :]
    body = body[body.index("<tbody") : body.index("</tbody>")]
    rows = re.findall(r"<tr>.*?</tr>", body, re.S)
    return [re.sub(r"[0-9a-f-]{36}|\d+|<time[^>]*>", "N", row) for row in rows]


async def test_no_page_of_the_host_tells_a_passed_check_from_a_job(
    canaries, api_key, machine_token, owner
):
    host = await host_online(machine_token, "rig")
    check = await host.recv_type("offer")  # the first load's check
    await host.answer(check, [await right_answer(check)])
    assert (await _verdict(check["job"])).passed
    request = chat_request(api_key, stream=False)
    real = await host.recv_type("offer")
    await host.answer(real, ["Hello there! How can I help?"])
    assert (await request).status_code == 200
    client = AsyncClient()
    await client.aforce_login(owner)
    earnings = (await client.get(reverse("billing:earnings"))).content.decode()
    machine = (
        await client.get(reverse("hosts:machine", args=[host.machine.id]))
    ).content.decode()
    for rows in (
        _rows(earnings, "Segments paid"),
        _rows(machine, 'id="recent-jobs"'),
    ):
        assert len(rows) == 2 and rows[0] == rows[1], rows
        assert not re.search(r"spot|canar|check", "".join(rows), re.I)
    assert "No failed spot checks." in machine
    await host.close()
