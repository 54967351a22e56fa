"""Liveness by process lease (hosts.liveness), rule 1 on rows (no websocket): the
SQL, the ORM and the model agree; a lapsed lease counts a machine online until
it ran out (its span, a hello after it, the offline alerts); a new process
prunes the leases that vouch for nobody."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from hosts import liveness
from hosts.models import CoordinatorLease, Device, Machine, OnlineSpan
from hosts.services import device_online_fraction, machine_hello
from hosts.web_services import machines_offline_alert
from jobs.selectors import devices_eligible, devices_live
from tests.jobs.helpers import job_queued


@pytest.fixture
def vouched_device(live_device, settings):
    """A live device whose recorded heartbeat is 2 h old; liveness from a lease."""
    settings.BALLAST_HEARTBEAT_MAX_AGE_S = 30
    device = live_device()
    now = timezone.now()
    lease = CoordinatorLease.objects.create(
        name="test", lease_until=now + timedelta(seconds=5)
    )
    Machine.objects.filter(id=device.machine_id).update(
        lease=lease, stale=False, last_heartbeat_at=now - timedelta(hours=2)
    )
    return device, lease


@pytest.mark.django_db
@pytest.mark.parametrize(
    "change, live",
    [
        ({}, True),
        ({"stale": True}, False),
        ({"connected": False}, False),
        ({"lease_until": -1}, False),
        ({"lease": None}, False),
        ({"stale": True, "recorded_s": 29}, True),
        ({"stale": True, "recorded_s": 30}, False),
        ({"connected": False, "recorded_s": 1}, False),
    ],
    ids=[
        "vouched",
        "stale",
        "closed",
        "lease lapsed",
        "no lease",
        "stale, heartbeat 29 s old",
        "stale, heartbeat 30 s old",
        "closed, heartbeat 1 s old",
    ],
)
def test_the_sql_the_orm_and_the_model_agree_on_rule_1(
    vouched_device, catalog, renter, change, live
):
    device, lease = vouched_device
    now = timezone.now()
    fields = {k: v for k, v in change.items() if k in ("stale", "connected", "lease")}
    if "recorded_s" in change:
        fields["last_heartbeat_at"] = now - timedelta(seconds=change["recorded_s"])
    if "lease_until" in change:
        CoordinatorLease.objects.filter(id=lease.id).update(
            lease_until=now + timedelta(seconds=change["lease_until"])
        )
    Machine.objects.filter(id=device.machine_id).update(**fields)
    job = job_queued(renter, catalog)
    machine = Machine.objects.select_related("lease").get(id=device.machine_id)
    assert machine.is_online(now) is live
    assert devices_live(now=now).filter(id=device.id).exists() is live
    assert (devices_eligible(job=job, model=catalog, now=now) == [device]) is live


@pytest.mark.django_db
def test_a_lapsed_lease_counts_online_until_it_ran_out(vouched_device):
    device, lease = vouched_device
    now = timezone.now()
    Device.objects.filter(id=device.id).update(first_seen_at=now - timedelta(hours=2))
    OnlineSpan.objects.filter(machine_id=device.machine_id).update(
        started_at=now - timedelta(hours=2), ended_at=now - timedelta(hours=2)
    )
    Machine.objects.filter(id=device.machine_id).update(
        last_heartbeat_at=now - timedelta(hours=2)
    )
    device = Device.objects.select_related("machine__lease").get(id=device.id)
    assert device_online_fraction(device=device, now=now) == 1, (
        "live: its open span counts until now"
    )
    CoordinatorLease.objects.filter(id=lease.id).update(
        lease_until=now - timedelta(hours=1)
    )
    device = Device.objects.select_related("machine__lease").get(id=device.id)
    assert abs(device_online_fraction(device=device, now=now) - Decimal("0.5")) < (
        Decimal("0.001")
    )


@pytest.mark.django_db
@pytest.mark.parametrize("gone_min, return_check", [(3, False), (11, True)])
def test_hello_after_a_lapsed_lease_ends_the_old_span_there(
    vouched_device, settings, gone_min, return_check
):
    """The machine counted online until its lease ran out; back after > 10 min
    from then gets a spot check (DESIGN.md "Spot checks")."""
    settings.BALLAST_SPOT_CHECKS = True
    device, lease = vouched_device
    now = timezone.now()
    OnlineSpan.objects.filter(machine_id=device.machine_id).update(
        started_at=now - timedelta(hours=2), ended_at=now - timedelta(hours=2)
    )
    Device.objects.filter(id=device.id).update(
        spot_check_due_at=None, spot_check_reason=""
    )
    gone = now - timedelta(minutes=gone_min)
    CoordinatorLease.objects.filter(id=lease.id).update(lease_until=gone)
    other = CoordinatorLease.objects.create(name="other", lease_until=now)
    machine_hello(
        machine_id=str(device.machine_id),
        channel_name="test.other!y",
        hello={
            "agent_version": "test",
            "engine_name": "scripted",
            "engine_version": "1",
            "public_key": "A" * 43 + "=",
            "accepts_serverless": True,
            "devices": [{"index": 0, "name": device.name, "vram_total_mb": 24576}],
        },
        now=now,
        lease_id=other.id,
    )
    span = OnlineSpan.objects.filter(machine_id=device.machine_id).first()
    assert span.ended_at == gone
    machine = Machine.objects.get(id=device.machine_id)
    assert machine.lease_id == other.id and machine.stale, "stale until a heartbeat"
    assert (
        Device.objects.filter(id=device.id, spot_check_reason="return").exists()
        is return_check
    )


@pytest.mark.django_db
def test_offline_alerts_count_from_the_end_of_a_lapsed_lease(vouched_device, settings):
    settings.BALLAST_OFFLINE_ALERT_AFTER_S = 300
    device, lease = vouched_device
    now = timezone.now()
    assert machines_offline_alert(now=now) == (0, 0), (
        "recorded heartbeat 2 h old, but the lease vouches: not silent"
    )
    CoordinatorLease.objects.filter(id=lease.id).update(
        lease_until=now - timedelta(seconds=200)
    )
    assert machines_offline_alert(now=now) == (0, 0), "seen 200 s ago"
    assert machines_offline_alert(now=now + timedelta(seconds=101)) == (1, 0)


@pytest.mark.django_db
def test_a_new_process_prunes_old_leases_that_vouch_for_nobody(vouched_device):
    from hosts.services import lease_renew

    device, lease = vouched_device
    now = timezone.now()
    old = now - timedelta(days=2)
    CoordinatorLease.objects.filter(id=lease.id).update(lease_until=old)
    orphan = CoordinatorLease.objects.create(name="gone", lease_until=old)
    recent = CoordinatorLease.objects.create(name="recent", lease_until=now)
    new_id = liveness.uuid.uuid4()
    lease_renew(lease_id=new_id, name="new", until=now + timedelta(seconds=5))
    left = set(CoordinatorLease.objects.values_list("id", flat=True))
    assert left == {lease.id, recent.id, new_id}, "the one a machine points at stays"
    assert orphan.id not in left
