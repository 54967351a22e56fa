"""Liveness of machines: DESIGN.md "Picking a device", rule 1, without a write per heartbeat.

A machine is **live** when its websocket is open and it had a heartbeat under
``BALLAST_HEARTBEAT_MAX_AGE_S`` (30 s) old. Two proofs of the heartbeat's age are
accepted, both exact (neither ever admits a 30 s-old heartbeat):

1. ``Machine.last_heartbeat_at`` under the max age. It is written on changes only
   (the first heartbeat of a connection, a heartbeat after a stale mark, a pause
   flag change, the stale mark and the disconnect themselves), always with the time
   of a heartbeat really received, so it never runs ahead of the real one.
2. The lease of the coordinator process the machine is connected to
   (``CoordinatorLease``): the machine points at it (``lease``, written by
   ``hello``), is not ``stale``, and ``lease_until`` is after now.

The lease is kept by one loop per process (``ProcessLease.run``), every
``BALLAST_LEASE_RENEW_S``: it takes ``t = now``, marks stale (a database write,
with the exact last heartbeat time) every machine of the process whose last
heartbeat, kept in memory, is older than ``stale_after_s()`` = max age − lease −
margin, and only then renews ``lease_until = t + BALLAST_LEASE_S``. So while the
lease holds, every non-stale machine of the process had a heartbeat within
``stale_after_s() + BALLAST_LEASE_S`` < max age. A heartbeat on a stale machine
un-marks it (under its connection's lock, which a tick that must mark the machine
waits for; and only while that heartbeat is younger than ``stale_after_s()``). If the loop stalls or the process dies, the lease lapses and
its machines stop being eligible at once; ``hello`` on another process takes them
over. Steady heartbeats cost no database write: one lease write per process per
renewal, amortised over all its machines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from ballast.db import db_call

from . import services

log = logging.getLogger("ballast.hosts")


def stale_after_s() -> float:
    """Seconds without a heartbeat after which the lease loop marks a machine stale.

    ``BALLAST_HEARTBEAT_MAX_AGE_S − BALLAST_LEASE_S − BALLAST_LEASE_MARGIN_S`` (at
    least 0): a non-stale machine under a live lease then had a heartbeat within
    the max age less the margin.
    """
    return max(
        0.0,
        settings.BALLAST_HEARTBEAT_MAX_AGE_S
        - settings.BALLAST_LEASE_S
        - settings.BALLAST_LEASE_MARGIN_S,
    )


def live_q(now: datetime, prefix: str = "") -> Q:
    """The Q of live machines (rule 1) at ``now``; ``prefix`` e.g. ``"machine__"``.

    Connected, and either the recorded heartbeat is under the max age or a
    non-stale machine's lease runs past ``now`` (module doc). The same rule as
    ``Machine.is_online`` and ``live_sql``.
    """
    cutoff = now - timedelta(seconds=settings.BALLAST_HEARTBEAT_MAX_AGE_S)
    return Q(**{f"{prefix}connected": True}) & (
        Q(**{f"{prefix}last_heartbeat_at__gt": cutoff})
        | Q(**{f"{prefix}stale": False, f"{prefix}lease__lease_until__gt": now})
    )


def live_sql(now: datetime, alias: str = "m") -> tuple[str, list]:
    """Rule 1 as SQL on ``hosts_machine`` aliased ``alias``, and its parameters.

    One text for PostgreSQL and SQLite; the same rule as ``live_q``.
    """
    ops = connection.ops
    cutoff = now - timedelta(seconds=settings.BALLAST_HEARTBEAT_MAX_AGE_S)
    sql = (
        f"{alias}.connected AND ({alias}.last_heartbeat_at > %s"
        f" OR (NOT {alias}.stale AND EXISTS (SELECT 1 FROM hosts_coordinatorlease ls"
        f" WHERE ls.id = {alias}.lease_id AND ls.lease_until > %s)))"
    )
    return sql, [
        ops.adapt_datetimefield_value(cutoff),
        ops.adapt_datetimefield_value(now),
    ]


HEARTBEAT_WRITES = 3  # heartbeat writes in flight per process (the pool has cores + 4)


class ProcessLease:
    """This coordinator process's lease and the machines connected to it (in memory).

    ``connections`` maps a machine id (str) to its consumer, which has
    ``channel_name``, ``heartbeat_memo`` (a ``hosts.services.HeartbeatMemo``: the
    last heartbeat time and whether the machine is marked stale),
    ``liveness_lock`` (an ``asyncio.Lock`` held by its heartbeat write in flight) and
    ``spot_checks_poke()``. ``lock`` is held by each tick (one at a time).
    ``write_gate`` bounds the heartbeat writes in flight (``HEARTBEAT_WRITES``), so
    a storm of them (every machine reconnecting) waits here, not in the shared
    thread pool's queue where it would delay the renewals past the lease. Un-marks
    of different machines run concurrently: a tick waits only for the un-marks in
    flight of machines it must mark stale. One instance per event loop
    (``process_lease``).
    """

    def __init__(self) -> None:
        self.id = uuid.uuid4()
        self.name = f"{socket.gethostname()} pid {os.getpid()}"[:200]
        self.lock = asyncio.Lock()
        self.write_gate = asyncio.Semaphore(HEARTBEAT_WRITES)
        self.connections: dict[str, Any] = {}
        self.task: asyncio.Task | None = None
        self.renewed_at: datetime | None = None
        self.loop = asyncio.get_running_loop()

    async def ensure(self) -> None:
        """Make sure the lease row exists (renewed once) and the loop runs."""
        if self.renewed_at is None:
            await self.tick()
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self.run(), name="ballast-liveness-lease")

    def join(self, machine_id: str, consumer: Any) -> None:
        """Register a connection that said ``hello`` (a newer one of the machine wins)."""
        self.connections[machine_id] = consumer
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self.run(), name="ballast-liveness-lease")

    def leave(self, machine_id: str, consumer: Any) -> None:
        """Forget a closed connection (only if it is still the registered one)."""
        if self.connections.get(machine_id) is consumer:
            del self.connections[machine_id]

    async def tick(self) -> None:
        """Mark stale the machines silent too long, then renew the lease (in that order).

        Then hands due spot checks to their connections. Raises what the database
        raises (the lease is then not renewed and lapses by itself).
        """
        limit = stale_after_s()
        async with self.lock:
            t = timezone.now()  # before the checks, after any wait for the lock
            due = []
            for machine_id, consumer in list(self.connections.items()):
                memo = consumer.heartbeat_memo
                if (
                    memo.last_beat_at is None
                    or (t - memo.last_beat_at).total_seconds() <= limit
                ):
                    continue
                if memo.stale and not consumer.liveness_lock.locked():
                    continue  # stale in the database, no un-mark in flight
                due.append((machine_id, consumer))
            held, marks, marked = [], [], []
            try:
                for machine_id, consumer in due:  # wait for un-marks in flight
                    await consumer.liveness_lock.acquire()
                    held.append(consumer)
                    memo = consumer.heartbeat_memo
                    if (
                        not memo.stale
                        and (t - memo.last_beat_at).total_seconds() > limit
                    ):
                        marks.append(
                            (machine_id, consumer.channel_name, memo.last_beat_at)
                        )
                        marked.append(memo)
                if marks:
                    await db_call(services.machines_stale_mark, own_thread=True)(
                        marks=marks
                    )
                    for memo in marked:  # only once written: a failed write retries
                        memo.stale = True
            finally:
                for consumer in held:
                    consumer.liveness_lock.release()
            # on a thread of its own: a renewal queued behind a burst of
            # requests' database work would let the lease lapse (every machine
            # of the process ineligible) while they are all connected
            await db_call(services.lease_renew, own_thread=True)(
                lease_id=self.id,
                name=self.name,
                until=t + timedelta(seconds=settings.BALLAST_LEASE_S),
            )
            self.renewed_at = t
        checks = settings.BALLAST_SPOT_CHECKS or settings.BALLAST_VERIFIER_CHECKS
        if checks and self.connections:
            due = await db_call(services.machines_spot_check_due)(
                lease_id=self.id, now=timezone.now()
            )
            for machine_id in due:
                consumer = self.connections.get(machine_id)
                if consumer is not None:
                    consumer.spot_checks_poke()

    async def run(self) -> None:
        """Tick every ``BALLAST_LEASE_RENEW_S`` while any machine is connected."""
        while self.connections:
            try:
                await self.tick()
            except Exception:
                log.exception("liveness lease %s: renewal failed", self.id)
            await asyncio.sleep(settings.BALLAST_LEASE_RENEW_S)
        self.task = None


_leases: dict[int, ProcessLease] = {}


async def process_lease() -> ProcessLease:
    """This process's lease for the running event loop, its row ensured and loop running.

    One per event loop (a process serves one loop; tests start one per test).
    """
    loop = asyncio.get_running_loop()
    lease = _leases.get(id(loop))
    if lease is None or lease.loop is not loop:
        for key, other in list(_leases.items()):
            if other.loop.is_closed():
                del _leases[key]
        lease = _leases[id(loop)] = ProcessLease()
    await lease.ensure()
    return lease
