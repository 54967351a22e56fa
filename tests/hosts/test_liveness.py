"""Liveness by process lease (hosts.liveness): DESIGN.md "Picking a device", rule 1.

A steady machine costs no database write, yet a heartbeat as old as the max age
is never eligible: the machine is marked stale first, or its process's lease
lapses. Times are shortened through the settings; the tests wait on states.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from decimal import Decimal

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from hosts import liveness
from hosts.models import CoordinatorLease, Device, Machine, OnlineSpan
from hosts.services import device_online_fraction, machine_hello
from hosts.web_services import machines_offline_alert
from jobs.models import Job
from jobs.selectors import devices_eligible, devices_live
from tests.jobs.helpers import host_online, job_queued

MAX_AGE_S = 4.0


@pytest.fixture
def short_liveness(settings):
    """Max age 4 s, lease 1 s renewed every 50 ms, margin 0.5 s: stale after 2.5 s."""
    settings.BALLAST_HEARTBEAT_MAX_AGE_S = MAX_AGE_S
    settings.BALLAST_LEASE_S = 1.0
    settings.BALLAST_LEASE_RENEW_S = 0.05
    settings.BALLAST_LEASE_MARGIN_S = 0.5
    settings.BALLAST_HEARTBEAT_INTERVAL_S = 0.2
    settings.BALLAST_SPOT_CHECKS = False
    assert liveness.stale_after_s() == 2.5


def live_now(machine_id) -> tuple[bool, bool, bool]:
    """(ORM rule, SQL rule, Machine.is_online) at one instant."""
    now = timezone.now()
    machine = Machine.objects.select_related("lease").get(id=machine_id)
    orm = devices_live(now=now).filter(machine_id=machine_id).exists()
    job = Job(model_id="smollm2-135m-instruct", placement={})
    from catalog.models import CatalogModel

    model = CatalogModel.objects.get(id=job.model_id)
    sql = any(
        d.machine_id == machine.id
        for d in devices_eligible(job=job, model=model, now=now)
    )
    return orm, sql, machine.is_online(now)


live_now_async = database_sync_to_async(live_now)


def is_live(machine_id):
    """An async predicate: the machine is live by the ORM rule now."""

    async def check():
        return (await live_now_async(machine_id))[0]

    return check


def connection_of(machine_id):
    """The consumer of the machine in this event loop's process lease."""
    loop = asyncio.get_running_loop()
    return liveness._leases[id(loop)].connections[str(machine_id)]


async def wait_until(predicate, timeout: float, what: str):
    """Poll an async predicate until it holds (a state, bounded in time)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


class Beating:
    """Heartbeats from a simulated host every ``interval`` s until stopped (its cadence)."""

    def __init__(self, host, interval: float = 0.2) -> None:
        self.host, self.interval = host, interval
        self.task = asyncio.create_task(self._run())

    async def _run(self):
        while True:
            await self.host.heartbeat()
            await asyncio.sleep(self.interval)

    async def stop(self):
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_steady_machine_is_vouched_by_the_lease_without_writes(
    catalog, machine_token, short_liveness
):
    host = await host_online(machine_token, "rig")
    first = await Machine.objects.aget(id=host.machine.id)
    assert first.lease_id is not None and not first.stale
    beating = Beating(host)
    try:
        # the recorded heartbeat ages past the max age: only the lease vouches now
        async def vouched():
            if timezone.now() - first.last_heartbeat_at < timedelta(
                seconds=MAX_AGE_S + 0.5
            ):
                return False
            return await live_now_async(host.machine.id) == (True, True, True)

        await wait_until(vouched, MAX_AGE_S * 3, "live on the lease alone")
        row = await Machine.objects.aget(id=host.machine.id)
        assert row.last_heartbeat_at == first.last_heartbeat_at, "no liveness write"
        assert not row.stale
        assert await OnlineSpan.objects.filter(machine_id=row.id).acount() == 1
    finally:
        await beating.stop()
        await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_silent_machine_is_never_eligible_at_the_max_age(
    catalog, machine_token, short_liveness
):
    host = await host_online(machine_token, "rig")
    beating = Beating(host)
    await asyncio.sleep(0)  # (the first beat of the cadence)
    await wait_until(
        lambda: asyncio.sleep(
            0,
            result=connection_of(host.machine.id).heartbeat_memo.recorded_at
            is not None,
        ),
        5,
        "heartbeats applied",
    )
    await beating.stop()
    memo = connection_of(host.machine.id).heartbeat_memo
    last = memo.last_beat_at  # when the coordinator received the last heartbeat

    # every observation while it is still live: the heartbeat is under the max age
    async def gone():
        now = timezone.now()
        orm, sql, model = await live_now_async(host.machine.id)
        assert orm == sql == model
        if orm:
            assert (now - last).total_seconds() < MAX_AGE_S, (
                "a stale heartbeat was live"
            )
        return not orm

    await wait_until(gone, MAX_AGE_S * 3, "the silent machine going offline")
    row = await Machine.objects.aget(id=host.machine.id)
    assert row.stale, "marked stale by the lease loop"
    assert row.last_heartbeat_at == last, "the exact last heartbeat is recorded"
    span = await OnlineSpan.objects.filter(machine_id=row.id).afirst()
    assert span.ended_at == last, "the online span ends at the last heartbeat"

    # its next heartbeat un-marks it at once
    await host.heartbeat()
    await wait_until(is_live(host.machine.id), 5, "live again on a heartbeat")
    row = await Machine.objects.aget(id=host.machine.id)
    assert not row.stale and row.last_heartbeat_at > last
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_stalled_lease_loop_makes_its_machines_ineligible(
    catalog, machine_token, short_liveness
):
    host = await host_online(machine_token, "rig")
    beating = Beating(host)
    try:

        async def vouched_alone():
            row = await Machine.objects.aget(id=host.machine.id)
            if timezone.now() - row.last_heartbeat_at <= timedelta(seconds=MAX_AGE_S):
                return False
            return await live_now_async(host.machine.id) == (True, True, True)

        await wait_until(vouched_alone, MAX_AGE_S * 3, "live on the lease alone")
        lease = connection_of(host.machine.id).lease
        async with lease.lock:  # the loop stalls: no renewal (heartbeats go on)
            until = (await CoordinatorLease.objects.aget(id=lease.id)).lease_until

            async def lapsed():
                now = timezone.now()
                live = (await live_now_async(host.machine.id))[0]
                if live:
                    assert now < until, "live after its lease ran out"
                return not live

            await wait_until(lapsed, 5, "the lease lapsing")
            assert timezone.now() >= until
        await wait_until(is_live(host.machine.id), 5, "live again on renewal")
        assert await live_now_async(host.machine.id) == (True, True, True)
    finally:
        await beating.stop()
        await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_disconnect_ends_the_span_at_the_last_heartbeat(
    catalog, machine_token, short_liveness
):
    host = await host_online(machine_token, "rig")
    consumer = connection_of(host.machine.id)
    before = consumer.heartbeat_memo.last_beat_at
    await host.heartbeat()
    await wait_until(
        lambda: asyncio.sleep(0, result=consumer.heartbeat_memo.last_beat_at != before),
        5,
        "heartbeat received",
    )
    last = consumer.heartbeat_memo.last_beat_at
    await host.close()

    async def offline():
        row = await Machine.objects.aget(id=host.machine.id)
        return not row.connected and row

    row = await wait_until(offline, 5, "disconnect recorded")
    assert row.stale and row.last_heartbeat_at == last
    span = await OnlineSpan.objects.filter(machine_id=row.id).afirst()
    assert span.ended_at == last


# --- the rule on rows (no websocket) -----------------------------------------------
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


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_hello_chosen_as_a_deadlocks_victim_is_recorded_on_a_retry(
    catalog, machine_token, monkeypatch
):
    """Two connections of one machine saying hello at once can deadlock with
    each other's device locks (found with two agents on one token): the victim,
    rolled back whole, is sent again and the host is welcomed."""
    from django.db import OperationalError
    from psycopg import errors

    from hosts import services
    from tests.hostsim import HostSim

    real_hello = services.machine_hello
    calls = []

    def deadlocked_once(**kwargs):
        calls.append(kwargs["machine_id"])
        if len(calls) == 1:
            try:
                raise errors.DeadlockDetected("deadlock detected")
            except errors.DeadlockDetected as exc:
                raise OperationalError("deadlock detected") from exc
        return real_hello(**kwargs)

    monkeypatch.setattr(services, "machine_hello", deadlocked_once)
    machine, token = await database_sync_to_async(machine_token)("rig")
    host = HostSim(token)
    welcome = await host.connect()
    assert welcome["machine_id"] == str(machine.id) and len(calls) == 2
    assert (await Machine.objects.aget(id=machine.id)).connected
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_offer_that_reaches_a_closing_connection_is_answered_at_once(
    catalog, machine_token, monkeypatch
):
    """A request step picked the machine as its connection closed: the offer,
    waiting for the closing handler or sent just after, is answered "host gone"
    at once (the job moves on) instead of after the 5 s claim deadline."""
    import threading

    from channels.layers import get_channel_layer

    from ballast import local
    from hosts import services
    from tests.hostsim import HostSim

    machine, token = await database_sync_to_async(machine_token)("rig")
    host = HostSim(token)
    await host.connect()
    machine = await Machine.objects.aget(id=machine.id)
    layer = get_channel_layer()
    replies: list[dict] = []
    answered = asyncio.Event()

    def reply(message):
        replies.append(message)
        answered.set()

    local.reader_add("job.test-reply", reply)
    closing, go_on = threading.Event(), threading.Event()
    real_disconnect = services.machine_disconnect

    def slow_disconnect(**kwargs):
        closing.set()
        go_on.wait(10)
        return real_disconnect(**kwargs)

    monkeypatch.setattr(services, "machine_disconnect", slow_disconnect)

    def offer(attempt):
        return {
            "type": "attempt.offer",
            "attempt": attempt,
            "reply": "job.test-reply",
            "frame": {"type": "offer", "job": attempt},
        }

    try:
        closed = asyncio.ensure_future(host.close())
        assert await asyncio.to_thread(closing.wait, 5)
        # the disconnect handler runs: this offer waits for it, then the close
        await local.channel_send(layer, machine.channel_name, offer("during"))
        go_on.set()
        await closed
        await asyncio.wait_for(answered.wait(), 5)
        answered.clear()
        # and one sent after the close
        await local.channel_send(layer, machine.channel_name, offer("after"))
        await asyncio.wait_for(answered.wait(), 5)
    finally:
        go_on.set()
        local.reader_remove("job.test-reply", reply)
    assert [(r["type"], r["attempt"]) for r in replies] == [
        ("host.gone", "during"),
        ("host.gone", "after"),
    ]
