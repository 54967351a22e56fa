"""A machine's online spans and the online part of the score.

DESIGN.md "Reliability score": 20 × the fraction of the last 24 h (or of the time
since the device was first seen, if shorter) its machine was online, heartbeat
gaps ≤ 30 s. Spans are opened and closed on liveness transitions
(``hosts.liveness``); a machine still online counts up to now.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection

from ballast.rows import columns, instances

from ..models import Device, Machine, OnlineSpan

UPTIME_WINDOW = timedelta(hours=24)


def online_span_extend(*, machine_id: str, now: datetime) -> None:
    """Extend the machine's latest online span to ``now``, or open a new one.

    Called when a machine becomes live (its first heartbeat, or the first after a
    stale mark); the span is ended by ``online_span_close`` (stale, disconnect, or
    the next ``hello`` after its process's lease lapsed), and a live machine's
    latest span counts until now. A gap longer than ``BALLAST_HEARTBEAT_MAX_AGE_S``
    since the span's end starts a new span, so offline time never counts as online.
    """
    gap = timedelta(seconds=settings.BALLAST_HEARTBEAT_MAX_AGE_S)
    extended = OnlineSpan.objects.filter(
        id__in=OnlineSpan.objects.filter(machine_id=machine_id, ended_at__gte=now - gap)
        .order_by("-ended_at")
        .values("id")[:1]
    ).update(ended_at=now)
    if not extended:
        OnlineSpan.objects.create(machine_id=machine_id, started_at=now, ended_at=now)


def online_span_close(*, machine_id: str, at: datetime) -> None:
    """End the machine's latest online span at ``at`` (never earlier than it ends)."""
    OnlineSpan.objects.filter(
        id__in=OnlineSpan.objects.filter(machine_id=machine_id)
        .order_by("-ended_at")
        .values("id")[:1],
        ended_at__lt=at,
    ).update(ended_at=at)


def machine_spans(*, machine_id, start: datetime) -> tuple[list[tuple], tuple | None]:
    """The machine's spans for a window from ``start``: (spans ended after
    ``start``, newest first; its newest span whatever its end, or None), each as
    (id, started_at, ended_at). One fixed statement (``ballast.rows``): the
    spans ended after ``start`` and the newest span, which a live machine
    keeps open at its start."""
    table = OnlineSpan._meta.db_table
    machine = OnlineSpan._meta.get_field("machine").get_db_prep_value(
        machine_id, connection
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {columns(_SPAN)} FROM {table} s WHERE s.machine_id = %s"
            f" AND (s.ended_at > %s OR s.id = (SELECT n.id FROM {table} n"
            " WHERE n.machine_id = %s ORDER BY n.ended_at DESC, n.id DESC LIMIT 1))"
            " ORDER BY s.ended_at DESC, s.id DESC",
            [machine, _ENDED_AT.get_db_prep_value(start, connection), machine],
        )
        rows = [
            (span.id, span.started_at, span.ended_at)
            for (span,) in (instances(row, _SPAN) for row in cursor.fetchall())
        ]
    return [r for r in rows if r[2] > start], rows[0] if rows else None


_SPAN = (OnlineSpan, "s")
_ENDED_AT = OnlineSpan._meta.get_field("ended_at")


def device_online_fraction(*, device: Device, now: datetime) -> Decimal:
    """Fraction (0..1, 6 places) of the last 24 h — or of the time since the device
    was first seen, if shorter — that its machine was online.

    One or two queries (``machine_spans``). Reads ``device.machine`` and its
    ``lease`` (select_related them).
    """
    start = max(now - UPTIME_WINDOW, device.first_seen_at)
    spans, latest = machine_spans(machine_id=device.machine_id, start=start)
    return online_fraction(
        machine=device.machine, start=start, spans=spans, latest=latest, now=now
    )


def spans_online(
    *, machine: Machine, spans: list[tuple], latest: tuple | None, now: datetime
) -> list[tuple[datetime, datetime]]:
    """The stretches the machine counted as online (pure; DESIGN.md "Reliability
    score": heartbeat gaps ≤ 30 s), as (start, end) newest first, none past ``now``.

    ``spans`` and ``latest`` as ``machine_spans`` returns them. The newest span
    of a machine live now lasts until ``now``; that of a machine still vouched
    for by a lapsed lease, until it was last seen (``Machine.seen_until``).
    Reads ``machine.lease``.
    """
    live = machine.is_online(now)
    # a connected machine not marked stale whose lease lapsed: online until then
    vouched = machine.connected and not machine.stale
    seen = machine.seen_until() if vouched and not live else None
    spans = list(spans)
    # the latest span stays open (ended at its start) while the machine is live
    if latest is not None and (not spans or spans[0][0] != latest[0]):
        spans.insert(0, latest)
    online = []
    for i, (_, started_at, ended_at) in enumerate(spans):  # newest first
        if i == 0 and live:
            end = now
        elif i == 0 and seen is not None:
            end = min(max(ended_at, seen), now)
        else:
            end = min(ended_at, now)
        if end > started_at:
            online.append((started_at, end))
    return online


def online_fraction(
    *,
    machine: Machine,
    start: datetime,
    spans: list[tuple],
    latest: tuple | None,
    now: datetime,
) -> Decimal:
    """The online part of the score from the machine's spans (pure; DESIGN.md
    "Reliability score": the fraction of [``start``, ``now``] it was online).

    ``spans`` are (id, started_at, ended_at) of the machine's spans ended after
    ``start``, newest first; ``latest`` is its newest span whatever its end (or
    None). Online stretches as ``spans_online`` counts them. Returns 0..1
    rounded to 6 places.
    """
    total = (now - start).total_seconds()
    if total <= 0:
        return Decimal(1)
    online = sum(
        max(0.0, (end - max(began, start)).total_seconds())
        for began, end in spans_online(
            machine=machine, spans=spans, latest=latest, now=now
        )
    )
    return min(Decimal(1), Decimal(str(round(online / total, 6))))
