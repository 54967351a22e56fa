"""The fleet establishes the answer of a check for a model the coordinator
cannot run (issue 31 item 4, ``trust.canaryfleet``): a candidate is sent as an
ordinary spot check to trusted devices of two owners; when both answer it
right it joins the pool, a wrong answer rejects it, and neither counts
against the device that gave it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from catalog.models import CatalogModel
from hosts.models import Device, DeviceOutcome
from hosts.services import machine_create, user_get_or_create
from jobs.models import CanaryPrompt, SpotCheck
from tests.hostsim import HostSim
from tests.jobs.helpers import heartbeat_applied, right_answer, verdict
from trust.canaryfleet import QUORUM, TRUST_OUTCOMES, devices_trusted
from trust.checkpools import device_checks_missing
from trust.spotchecks import spot_checks_schedule

OTHER = "tiny-llama-3"
"""A catalog model this coordinator has no reference engine of."""


@pytest.fixture
def other_model(catalog, settings):
    settings.BALLAST_SPOT_CHECKS = True
    settings.BALLAST_SPOT_CHECK_MAX_DELAY_S = 0
    settings.BALLAST_CANARY_RATE = 0
    settings.BALLAST_CANARY_SECRET = "tests"
    settings.BALLAST_CANARY_POOL_AHEAD = 1
    settings.BALLAST_HEARTBEAT_INTERVAL_S = settings.BALLAST_HEARTBEAT_MAX_AGE_S / 2
    return CatalogModel.objects.create(
        id=OTHER,
        family="llama",
        context_length=512,
        vram_per_request_mb=64,
        price_completion_nano=100,
    )


async def _host(email: str, *, reference: bool = True) -> HostSim:
    """A scripted host of its own owner serving only ``OTHER``; a reference
    device when ``reference``. Its first-load check finds no pool: dropped."""
    user = await database_sync_to_async(user_get_or_create)(email=email)
    machine, token = await database_sync_to_async(machine_create)(
        owner_email=user.email, name="rig"
    )
    host = HostSim(token)
    await host.connect()
    await host.heartbeat(models=(OTHER,))
    await heartbeat_applied(machine)
    host.machine = machine
    host.device = await Device.objects.aget(machine=machine)
    await Device.objects.filter(id=host.device.id).aupdate(reference=reference)
    return host


async def _answer(host: HostSim, text: str | None = None) -> SpotCheck:
    """Take the host's due check (a heartbeat), answer it (right unless
    ``text``) and wait for its verdict."""
    await host.heartbeat(models=(OTHER,))
    offer = await host.recv_type("offer")
    await host.answer(offer, [text or await right_answer(offer)])
    return await verdict(offer["job"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_two_owners_agreeing_put_a_candidate_in_the_pool(other_model):
    first, second = await _host("a@example.com"), await _host("b@example.com")
    assert await database_sync_to_async(spot_checks_schedule)() == QUORUM
    a, b = await _answer(first), await _answer(second)
    assert a.canary_id == b.canary_id and a.reason == b.reason == "calibration"
    canary = await CanaryPrompt.objects.aget(id=a.canary_id)
    assert canary.status == CanaryPrompt.Status.CALIBRATED
    assert canary.expected in canary.reference_output
    assert canary.params["temperature"] == 0 and canary.sent_count == 0
    assert not await DeviceOutcome.objects.filter(
        source=DeviceOutcome.Source.SPOT_CHECK
    ).aexists(), "a vote is no outcome of the device"
    # the model now has a calibrated check: a device of a third owner is checked
    third = await _host("c@example.com", reference=False)
    missing = await database_sync_to_async(device_checks_missing)(
        device_id=third.device.id
    )
    assert missing == []
    for host in (first, second, third):
        await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_wrong_answer_rejects_the_candidate_and_blames_no_one(other_model):
    first, second = await _host("a@example.com"), await _host("b@example.com")
    assert await database_sync_to_async(spot_checks_schedule)() == QUORUM
    right = await _answer(first)
    canary = await CanaryPrompt.objects.aget(id=right.canary_id)
    wrong = await _answer(second, text="I do not know.")
    assert wrong.canary_id == canary.id and wrong.passed is False
    await canary.arefresh_from_db()
    assert canary.status == CanaryPrompt.Status.REJECTED
    await second.device.arefresh_from_db()
    assert not second.device.quarantined
    assert not await DeviceOutcome.objects.filter(
        device=second.device, source=DeviceOutcome.Source.SPOT_CHECK
    ).aexists()
    for host in (first, second):
        await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_one_owner_alone_establishes_nothing(other_model):
    host = await _host("a@example.com")
    assert await database_sync_to_async(spot_checks_schedule)() == 0
    assert not await CanaryPrompt.objects.filter(model_id=OTHER).aexists()
    await host.close()


@pytest.mark.django_db
def test_trusted_is_a_reference_device_or_an_established_clean_record(
    other_model, live_device
):
    device = live_device("tiny", models=(OTHER,))
    now = timezone.now()

    def trusted() -> bool:
        return devices_trusted(model=other_model, now=now).filter(id=device.id).exists()

    assert not trusted(), "new, with no record"
    Device.objects.filter(id=device.id).update(
        first_seen_at=now - timedelta(days=8)
    )
    DeviceOutcome.objects.bulk_create(
        DeviceOutcome(
            device=device, source=DeviceOutcome.Source.ATTEMPT, success=True
        )
        for _ in range(TRUST_OUTCOMES)
    )
    assert trusted(), "a week old, clean record"
    DeviceOutcome.objects.create(
        device=device, source=DeviceOutcome.Source.SPOT_CHECK, success=False
    )
    assert not trusted(), "one failed spot check"
    Device.objects.filter(id=device.id).update(reference=True)
    assert trusted(), "marked a reference device by staff"
    Device.objects.filter(id=device.id).update(quarantined=True)
    assert not trusted(), "quarantined"
