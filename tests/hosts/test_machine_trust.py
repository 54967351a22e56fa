"""DESIGN.md "Fair to honest hosts": quarantine, suspicion and held earnings
belong to the machine and its owner, not to a device index a host can rename
(issue 32 item 2; ``hosts.services.trust``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import Earning
from hosts.models import Device, DeviceOutcome
from hosts.services import (
    device_outcome_record,
    device_quarantine,
    device_quarantine_release_judge,
    machine_create,
    machine_hello,
    machine_suspected_since,
)
from tests.billing.helpers import Rig
from tests.devices import MODEL, device_online
from trust.failures import device_check_failed
from trust.verification.rate import verification_rate

pytestmark = pytest.mark.django_db

QUARANTINED = Device.QuarantineReason


def _hello(device: Device, *indexes: int, now=None) -> dict[int, Device]:
    """The device's machine says ``hello`` again announcing ``indexes``; its
    devices by index."""
    machine_hello(
        machine_id=str(device.machine_id),
        channel_name=f"test.{device.machine_id}!again",
        hello={
            "agent_version": "test",
            "engine_name": "scripted",
            "engine_version": "1",
            "public_key": device.machine.public_key,
            "accepts_serverless": True,
            "devices": [
                {"index": i, "name": "NVIDIA GeForce RTX 4090", "vram_total_mb": 24576}
                for i in indexes
            ],
        },
        now=now,
    )
    return {d.index: d for d in Device.objects.filter(machine_id=device.machine_id)}


@pytest.fixture
def checks_on(settings):
    """Spot checks on (marked due at once), judged here by hand."""
    settings.BALLAST_SPOT_CHECKS = True
    settings.BALLAST_SPOT_CHECK_MAX_DELAY_S = 0


def _check(device: Device, *, passed: bool) -> None:
    """A spot check of ``device`` judged: an outcome, then release judged."""
    device_outcome_record(
        device_id=device.id, success=passed, source="spot_check", model_id=MODEL
    )
    if passed:
        device_quarantine_release_judge(device_id=device.id)


def test_it_keeps_a_renamed_device_of_a_quarantined_one_quarantined(
    live_device, checks_on
):
    """The bug: a hello announcing index 1 instead of 0 made a fresh device,
    not quarantined. Now it starts quarantined (inherited, 3 passes to leave)
    with a check due; announcing index 0 again finds device 0 still quarantined."""
    device = live_device()
    device_quarantine(device_id=device.id, reason=QUARANTINED.FAILURES, now=None)
    devices = _hello(device, 1)
    renamed = devices[1]
    assert devices[0].retired_at is not None
    assert renamed.quarantined and renamed.quarantine_reason == QUARANTINED.INHERITED
    assert renamed.spot_check_due_at is not None
    assert renamed.quarantine_passes_needed == 3
    for _ in range(2):
        _check(renamed, passed=True)
    assert Device.objects.get(id=renamed.id).quarantined, "3 passes in a row, not 2"
    _check(renamed, passed=True)
    assert not Device.objects.get(id=renamed.id).quarantined
    assert _hello(device, 0)[0].quarantined, "back to index 0: still quarantined"


def test_a_retired_index_declared_again_inherits_the_quarantine(live_device, checks_on):
    """Fresh-eyes review 5: a hello declaring devices 0 and 1, then 0 alone
    (1 retired), then, once 0 was quarantined, 1 alone: device 1 came back
    free and took renter work. A retired device declared again is a renamed
    one: it starts quarantined (inherited) with a check due."""
    device = live_device()
    _hello(device, 0, 1)
    assert _hello(device, 0)[1].retired_at is not None
    device_quarantine(device_id=device.id, reason=QUARANTINED.FAILURES, now=None)
    back = _hello(device, 1)[1]
    assert back.retired_at is None
    assert back.quarantined and back.quarantine_reason == QUARANTINED.INHERITED
    assert back.spot_check_due_at is not None


def test_a_retired_index_of_a_clean_machine_comes_back_with_a_check_due(
    live_device, checks_on
):
    """With nothing against the machine, a device declared again after being
    retired is not held out of work: a spot check is due (DESIGN.md "Spot
    checks"), as before."""
    device = live_device()
    added = _hello(device, 0, 1)[1]
    _check(added, passed=True)  # (a device new to the machine: checked first)
    assert not Device.objects.get(id=added.id).quarantined
    _hello(device, 0)
    back = _hello(device, 0, 1)[1]
    assert not back.quarantined and back.spot_check_due_at is not None


def test_a_renamed_device_goes_on_from_its_predecessors_record(live_device, checks_on):
    """Its machine's retired devices' outcomes are the renamed device's too
    (fresh-eyes review 3: a refuser whose score neared 50 renamed its device
    to start again at 60)."""
    device = live_device()
    for success in [False] * 40 + [True] * 10:
        device_outcome_record(device_id=device.id, success=success, model_id=MODEL)
    low = Device.objects.get(id=device.id).score
    assert low < 50
    renamed = _hello(device, 1)[1]
    _check(renamed, passed=True)
    assert Device.objects.get(id=renamed.id).score <= low + 2, "not back at 60"


def test_a_device_new_to_a_machine_takes_no_work_before_it_passes_a_check(
    live_device, checks_on
):
    device = live_device()
    devices = _hello(device, 0, 1)
    assert not devices[0].quarantined, "a known device keeps its state"
    new = devices[1]
    assert new.quarantined and new.quarantine_reason == QUARANTINED.NEW_DEVICE
    assert new.spot_check_due_at is not None
    _check(new, passed=False)  # one failure: not a quarantine's, still held
    assert Device.objects.get(id=new.id).quarantined
    _check(new, passed=True)
    assert not Device.objects.get(id=new.id).quarantined, "one pass releases it"


def test_the_first_devices_of_a_machine_of_a_clean_owner_work_at_once(
    live_device, checks_on
):
    device = live_device()
    assert not device.quarantined and device.machine.suspected_at is None


def test_a_failure_of_a_device_held_as_new_needs_3_passes_when_it_quarantines(
    live_device, checks_on
):
    device = live_device()
    new = _hello(device, 0, 1)[1]
    for _ in range(3):
        _check(new, passed=False)
    new.refresh_from_db()
    assert new.quarantined and new.quarantine_reason == QUARANTINED.FAILURES
    assert new.quarantine_passes_needed == 3


def test_no_device_is_held_as_new_with_spot_checks_off(live_device, settings):
    """Nothing could release it: with checks off a new device works at once
    (a quarantined machine's new device still inherits its quarantine)."""
    settings.BALLAST_SPOT_CHECKS = False
    device = live_device()
    assert not _hello(device, 0, 1)[1].quarantined
    device_quarantine(device_id=device.id, reason=QUARANTINED.STAFF, now=None)
    assert _hello(device, 0, 1, 2)[2].quarantine_reason == QUARANTINED.INHERITED


def test_a_new_machine_of_an_owner_with_a_quarantined_one_starts_under_suspicion(
    live_device, owner, checks_on, settings
):
    settings.BALLAST_VERIFY_RATE = 0.05
    settings.BALLAST_VERIFY_NEW_RATE = 0.0
    settings.BALLAST_VERIFY_SUSPECT_RATE = 0.5
    first = live_device("first")
    device_quarantine(device_id=first.id, reason=QUARANTINED.FAILURES, now=None)
    machine, _ = machine_create(owner_email=owner.email, name="second")
    second = device_online(machine)
    machine.refresh_from_db()
    assert machine.suspected_at is not None
    assert machine_suspected_since(machine_id=machine.id) == machine.suspected_at
    assert second.quarantined, "checked before work"
    assert second.quarantine_reason == QUARANTINED.NEW_DEVICE
    assert verification_rate(device_id=second.id) == 0.5, "verified more"
    other, _ = machine_create(owner_email="someone@example.com", name="other")
    assert not device_online(other).quarantined, "another owner's is not touched"


def test_suspicion_follows_the_machine_to_a_renamed_device(
    live_device, checks_on, settings
):
    settings.BALLAST_VERIFY_RATE = 0.05
    settings.BALLAST_VERIFY_NEW_RATE = 0.0
    settings.BALLAST_VERIFY_SUSPECT_RATE = 0.5
    device = live_device()
    device_check_failed(
        device_id=device.id, model_id=MODEL, detail="test", now=timezone.now()
    )
    failed_at = DeviceOutcome.objects.get(device=device, success=False).created_at
    renamed = _hello(device, 1)[1]
    assert machine_suspected_since(machine_id=device.machine_id) == failed_at
    assert verification_rate(device_id=renamed.id) == 0.5
    for _ in range(5):
        _check(renamed, passed=True)
    assert verification_rate(device_id=renamed.id) == pytest.approx(0.25), (
        "each device earns its way back with its own passes"
    )


def test_a_failed_check_reverses_the_held_earnings_of_every_device_the_machine_had(
    catalog, renter, settings
):
    """The bug: held earnings were reversed per device, so a host that renamed
    its device before a failed check kept what the old index had earned."""
    settings.BALLAST_SPOT_CHECKS = False
    rig = Rig(models=[MODEL])
    host = rig.host_add("a")
    bystander = rig.host_add("b")  # another owner's machine: untouched
    for device in (host.device, bystander.device):
        job = rig.job(renter=renter, model=MODEL)
        rig.segment(job, text="abcdefghij", tokens=2, device=device)
        rig.finish(job)
    assert Earning.objects.filter(status=Earning.Status.HELD).count() == 2
    renamed = _hello(host.device, 1, now=rig.now + timedelta(seconds=1))[1]
    reversed_count = device_check_failed(
        device_id=renamed.id, model_id=MODEL, detail="test", now=rig.now
    )
    assert reversed_count == 1
    statuses = {e.device_id: e.status for e in Earning.objects.all()}
    assert statuses == {
        host.device.id: Earning.Status.REVERSED,
        bystander.device.id: Earning.Status.HELD,
    }
