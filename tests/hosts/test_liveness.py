"""Liveness by process lease (hosts.liveness): DESIGN.md "Picking a device", rule 1.

A steady machine costs no database write, yet a heartbeat as old as the max age
is never eligible: the machine is marked stale first, or its process's lease
lapses. Times are shortened through the settings; the tests wait on states.
The same rule on rows alone is test_liveness_rows.py.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from hosts import liveness
from hosts.models import CoordinatorLease, Machine, OnlineSpan
from jobs.models import Job
from jobs.selectors import devices_eligible, devices_live
from tests.jobs.helpers import host_online

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
