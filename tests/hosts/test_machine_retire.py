"""Retiring a machine (issue 24 item 5): kept in the records with its devices,
jobs and earnings, but its token stops, its devices are never eligible nor
rentable again, it sends no offline alert, and its name is free again. A machine
with a renter's open rental is not retired."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import Earning
from hosts.models import Device, Machine
from hosts.services import (
    MachineRefused,
    machine_authenticate,
    machine_heartbeat,
    machine_hello,
    machine_register,
)
from hosts.web_services import (
    MachineRetireRefused,
    machine_retire,
    machines_offline_alert,
)
from jobs.models import Rental
from jobs.selectors import devices_live, devices_rentable
from tests.devices import device_online

pytestmark = pytest.mark.django_db


def test_a_retired_machine_keeps_its_records_and_never_works_again(
    owner, catalog, live_device
):
    device = live_device("rig")
    machine = device.machine
    Earning.objects.create(
        device=device,
        host=owner,
        amount_nano=1_000,
        release_at=timezone.now() + timedelta(hours=24),
    )
    assert machine_retire(machine=machine) is True
    machine.refresh_from_db()
    device.refresh_from_db()
    assert machine.retired_at is not None and machine.token_prefix == ""
    assert machine.token_hash.startswith("retired:")
    assert device.retired_at is not None and device.slots_total == 0
    assert not device.models.filter(loaded=True).exists()
    assert Earning.objects.filter(device=device).count() == 1, "records are kept"
    now = timezone.now()
    assert not devices_live(now=now).exists()
    assert not devices_rentable(now=now).exists()
    assert machine_retire(machine=machine) is False, "retired once"


def test_its_token_no_longer_authenticates_and_a_hello_is_refused(owner, catalog):
    machine, token = machine_register(owner=owner, name="rig")
    assert machine_authenticate(token=token) == machine
    machine_retire(machine=machine)
    assert machine_authenticate(token=token) is None
    with pytest.raises(MachineRefused, match="retired"):
        device_online(machine)  # an agent already past its handshake
    assert not Device.objects.filter(machine=machine).exists()


def test_a_heartbeat_after_retirement_changes_no_device(owner, catalog, live_device):
    device = live_device("rig")
    machine_retire(machine=device.machine)
    machine_heartbeat(
        machine_id=str(device.machine_id),
        heartbeat={
            "paused": False,
            "devices": [
                {
                    "index": 0,
                    "temp_c": 40.0,
                    "vram_free_mb": 9000,
                    "loaded_models": [catalog.id],
                    "slots": 4,
                }
            ],
        },
    )
    device.refresh_from_db()
    assert device.slots_total == 0 and device.retired_at is not None


def test_its_name_is_free_for_a_new_machine(owner):
    old, _ = machine_register(owner=owner, name="rig-1")
    machine_retire(machine=old)
    new, _ = machine_register(owner=owner, name="rig-1")
    assert new.id != old.id
    assert Machine.objects.filter(owner=owner, name="rig-1").count() == 2


def test_a_machine_with_an_open_rental_is_not_retired(
    owner, renter, catalog, live_device
):
    device = live_device("rig")
    Rental.objects.create(
        renter=renter,
        device=device,
        hours=2,
        price_per_hour_nano=1,
        status=Rental.Status.LIVE,
        ends_at=timezone.now() + timedelta(hours=2),
    )
    with pytest.raises(MachineRetireRefused, match="rented rig/gpu0 until"):
        machine_retire(machine=device.machine)
    device.machine.refresh_from_db()
    assert device.machine.retired_at is None
    Rental.objects.update(status=Rental.Status.ENDED)
    assert machine_retire(machine=device.machine) is True


def test_a_retired_machine_sends_no_offline_alert(
    owner, catalog, live_device, mailoutbox
):
    device = live_device("rig")
    machine_retire(machine=device.machine)
    Machine.objects.filter(id=device.machine_id).update(
        connected=False, last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    assert machines_offline_alert() == (0, 0)
    assert mailoutbox == []


def test_a_hello_of_a_retired_machine_leaves_its_devices_retired(owner, catalog):
    machine, _ = machine_register(owner=owner, name="rig")
    device_online(machine)
    machine_retire(machine=machine)
    with pytest.raises(MachineRefused):
        machine_hello(
            machine_id=str(machine.id),
            channel_name="test.again",
            hello={
                "agent_version": "t",
                "engine_name": "scripted",
                "engine_version": "1",
                "public_key": "A" * 43 + "=",
                "accepts_serverless": True,
                "devices": [{"index": 0, "name": "GPU", "vram_total_mb": 1}],
            },
        )
    assert Device.objects.get(machine=machine).retired_at is not None
