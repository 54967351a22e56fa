"""What of a rental's period is billed (DESIGN.md "Money", "Rentals"): the time
its device was live and not paused.

*Live* is the machine's online record, the one the uptime part of the score
reads (``hosts.services.spans_online``: spans opened and closed on liveness
transitions; a gap between heartbeats up to ``BALLAST_HEARTBEAT_MAX_AGE_S``
counts as online, as a heartbeat that age does for eligibility). *Paused* is
the rental's ``RentalPause`` rows, opened and closed by the beat task
``jobs.rentals.rentals_watch`` as it sees the device paused (by its owner, its
agent or staff) and back. Times are timezone-aware UTC; a stretch is a
(start, end) pair with start < end.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from hosts.services import machine_spans, spans_online

from .models import Rental, RentalPause

Stretch = tuple[datetime, datetime]

MICROSECOND = timedelta(microseconds=1)


def stretches_within(
    stretches: Iterable[Stretch], since: datetime, upto: datetime
) -> list[Stretch]:
    """``stretches`` cut to [``since``, ``upto``], sorted and merged where they
    overlap or touch (pure). Empty ones are dropped."""
    cut = sorted(
        (max(start, since), min(end, upto))
        for start, end in stretches
        if min(end, upto) > max(start, since)
    )
    merged: list[Stretch] = []
    for start, end in cut:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def stretches_minus(kept: list[Stretch], holes: list[Stretch]) -> list[Stretch]:
    """The parts of ``kept`` outside every one of ``holes`` (pure; both sorted
    and merged, as ``stretches_within`` returns them)."""
    result: list[Stretch] = []
    for start, end in kept:
        for hole_start, hole_end in holes:
            if hole_end <= start or hole_start >= end:
                continue
            if hole_start > start:
                result.append((start, hole_start))
            start = max(start, hole_end)
            if start >= end:
                break
        if start < end:
            result.append((start, end))
    return result


def rental_live_stretches(
    *, rental: Rental, since: datetime, upto: datetime, now: datetime
) -> list[Stretch]:
    """The stretches of [``since``, ``upto``] during which the rental's device
    was live and not paused, sorted.

    ``rental``: with ``device.machine`` and its ``lease`` loaded (the newest
    span of a machine live at ``now`` lasts until ``now``). Two or three
    queries: the machine's spans (``hosts.services.machine_spans``) and the
    rental's pauses overlapping the period (an open one lasts until ``upto``).
    """
    if upto <= since:
        return []
    machine = rental.device.machine
    spans, latest = machine_spans(machine_id=machine.id, start=since)
    online = spans_online(machine=machine, spans=spans, latest=latest, now=now)
    pauses = RentalPause.objects.filter(rental_id=rental.id, started_at__lt=upto)
    paused = [
        (started_at, ended_at or upto)
        for started_at, ended_at in pauses.values_list("started_at", "ended_at")
    ]
    return stretches_minus(
        stretches_within(online, since, upto), stretches_within(paused, since, upto)
    )


def rental_live_amount_nano(
    *, rental: Rental, since: datetime, upto: datetime, now: datetime
) -> int:
    """What the rental's live, unpaused time in [``since``, ``upto``] costs at
    its ``price_per_hour_nano``: nano-USD, rounded down to a whole one, exact
    (integer microseconds × price ÷ 3.6 × 10⁹)."""
    stretches = rental_live_stretches(rental=rental, since=since, upto=upto, now=now)
    micro = sum((end - start) // MICROSECOND for start, end in stretches)
    return micro * rental.price_per_hour_nano // (3600 * 1_000_000)


def rental_pause_note(*, rental: Rental, paused: bool, now: datetime) -> None:
    """Record what the watch sees of a live rental's device at ``now``: a pause
    begins (a ``RentalPause`` opened, if none is) or ends (the open one closed
    at ``now``). Call inside the transaction holding the rental's row."""
    open_pauses = RentalPause.objects.filter(rental_id=rental.id, ended_at=None)
    if not paused:
        open_pauses.update(ended_at=now)
    elif not open_pauses.exists():
        RentalPause.objects.create(rental_id=rental.id, started_at=now)


def rental_paused_since(*, rental: Rental) -> datetime | None:
    """When the rental's device was seen paused, for the pause still open; None
    when it is not paused."""
    return (
        RentalPause.objects.filter(rental_id=rental.id, ended_at=None)
        .order_by("started_at")
        .values_list("started_at", flat=True)
        .first()
    )
