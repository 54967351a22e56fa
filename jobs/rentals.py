"""Rentals: a device reserved for one renter, checked before and during (DESIGN.md).

``pending`` until a spot check passes, then ``live`` for its hours; a failed check
``stopped``s it and the renter pays only up to the last passed check; so does its
device offline or paused for ``BALLAST_RENTAL_OFFLINE_END_S`` (``rentals_watch``,
its owner emailed why); it ``ended``s at its end or when the renter ends it.
Billed at its hourly price for the time its device was live and not paused
(``jobs.rentaltime``), through the ledger; the rest of the period is never
charged (the renter's credit held for it is free again).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from billing.money import usd_to_nano
from billing.services import rental_charge
from hosts import emails
from hosts.models import Device
from hosts.services import spot_check_mark_due

from .errors import ApiError
from .hooks import hook
from .models import Rental
from .rentaltime import rental_live_amount_nano, rental_pause_note, rental_paused_since
from .selectors import devices_live
from .services import credit_available_nano, credit_lock

log = logging.getLogger("ballast.rentals")

MAX_HOURS = 24 * 30


def rental_price_per_hour_nano() -> int:
    """The rental price per device-hour in nano-USD (``BALLAST_RENTAL_USD_PER_HOUR``)."""
    return usd_to_nano(Decimal(settings.BALLAST_RENTAL_USD_PER_HOUR))


def device_rented(device_id: int) -> Rental | None:
    """The open (pending or live) rental of a device, if any."""
    return Rental.objects.filter(
        device_id=device_id, status__in=Rental.OPEN_STATUSES
    ).first()


@transaction.atomic
def rental_create(
    *, renter, device_id: int, hours: int, now: datetime | None = None
) -> Rental:
    """Reserve a live device for ``hours``; it goes live after a passed spot check.

    Raises ApiError 400 (hours), 404 (no such live device), 403 (the renter's
    own device: a host cannot pay itself), 409 (already rented or quarantined;
    ``device_unchecked``: it cannot be spot-checked, none of its models having
    calibrated checks, so the check it would wait for never comes:
    ``hooks.TrustHook.device_unchecked``), 402 (balance
    below the whole period's price).
    """
    now = now or timezone.now()
    if (
        not isinstance(hours, int)
        or isinstance(hours, bool)
        or not 1 <= hours <= MAX_HOURS
    ):
        raise ApiError(
            400,
            f"'hours' must be an integer from 1 to {MAX_HOURS}",
            "invalid_request",
            "hours",
        )
    device = (
        devices_live(now=now)
        .select_related("machine")
        .select_for_update(of=("self",))  # SQLite: its one writer
        .filter(id=device_id)
        .first()
    )
    if device is None:
        raise ApiError(404, f"no live device {device_id}", "device_not_found", "device")
    if device.machine.owner_id == renter.pk:
        raise ApiError(
            403,
            f"device {device_id} is your own: you cannot rent your own device",
            "own_device",
            "device",
        )
    if device.quarantined or device.paused:
        raise ApiError(
            409,
            f"device {device_id} is not available for rent",
            "device_unavailable",
            "device",
        )
    if device_rented(device.id):
        raise ApiError(
            409, f"device {device_id} is already rented", "device_rented", "device"
        )
    unchecked = hook().device_unchecked(device_id=device.id)
    if unchecked:
        raise ApiError(
            409,
            f"device {device_id} cannot be spot-checked yet: {unchecked}; "
            "a rental starts only after a passed check",
            "device_unchecked",
            "device",
        )
    price = rental_price_per_hour_nano()
    account = credit_lock(renter=renter)
    available = credit_available_nano(renter=renter, account=account)
    if available < price * hours:
        raise ApiError(
            402, "balance cannot cover the rental's whole period", "insufficient_credit"
        )
    rental = Rental.objects.create(
        renter=renter, device=device, hours=hours, price_per_hour_nano=price
    )
    Device.objects.filter(id=device.id).update(spot_check_due_at=None)
    spot_check_mark_due(
        device_id=device.id, reason="rental", now=now - timedelta(days=1)
    )
    return rental


def _rental_locked(rental_id) -> Rental | None:
    """The rental's row, locked until the transaction ends (SQLite: its one writer)."""
    return (
        Rental.objects.select_for_update(of=("self",))
        .select_related("renter", "device__machine__owner", "device__machine__lease")
        .filter(id=rental_id)
        .first()
    )


def _rental_move(rental: Rental, to: str, **fields) -> bool:
    """Compare-and-set the locked ``rental`` from its status to ``to`` (and
    ``fields``); True when this call moved it (its row count was 1)."""
    moved = Rental.objects.filter(id=rental.id, status=rental.status).update(
        status=to, **fields
    )
    if moved:
        rental.status = to
        for name, value in fields.items():
            setattr(rental, name, value)
    return bool(moved)


@transaction.atomic
def rental_start(*, rental_id, now: datetime) -> bool:
    """A pending rental goes live at ``now`` (its first check passed) for its
    hours, billed from ``now``. One transaction on the locked row; True when this
    call started it, False when it was not pending (started, ended or stopped)."""
    rental = _rental_locked(rental_id)
    if rental is None or rental.status != Rental.Status.PENDING:
        return False
    return _rental_move(
        rental,
        Rental.Status.LIVE,
        starts_at=now,
        ends_at=now + timedelta(hours=rental.hours),
        last_pass_at=now,
        last_check_at=now,
        billed_until=now,
    )


@transaction.atomic
def rentals_after_check(*, device_id: int, passed: bool, now: datetime) -> None:
    """Apply a spot check's verdict to the device's open rental (pending or live).

    Pass: a pending rental starts (``rental_start``), a live one records the pass.
    Failure: the rental is ``stopped`` and a live one billed up to its last pass,
    never later. One transaction on the locked rental row, so an end at the same
    time (``rental_end``) sees the stop and charges nothing more.
    """
    opened = device_rented(device_id)
    if opened is None:
        return
    rental = _rental_locked(opened.id)
    if rental.status not in Rental.OPEN_STATUSES:
        return  # ended between the two reads
    if passed and rental.status == Rental.Status.PENDING:
        rental_start(rental_id=rental.id, now=now)
    elif passed:
        Rental.objects.filter(id=rental.id).update(last_pass_at=now, last_check_at=now)
    else:
        was_live = rental.status == Rental.Status.LIVE
        _rental_move(
            rental,
            Rental.Status.STOPPED,
            last_check_at=now,
            stop_reason="a spot check failed",
        )
        if was_live:
            rental_bill(rental=rental, upto=rental.last_pass_at, now=now)


@transaction.atomic
def rental_end(*, rental: Rental, now: datetime | None = None) -> Rental:
    """End a rental (the renter's choice, or its period is over) and bill it.

    ``rental``: only its id is read; the row is locked and read again, so a
    retry, a second end at once or an end after a failed check's stop changes
    and charges nothing (a live rental is billed once, up to ``min(now,
    ends_at)``). One transaction. Returns the rental as it now is.
    """
    now = now or timezone.now()
    rental = _rental_locked(rental.id)
    if rental.status == Rental.Status.PENDING:
        _rental_move(rental, Rental.Status.ENDED, stop_reason="ended before going live")
    elif rental.status == Rental.Status.LIVE:
        upto = min(now, rental.ends_at)
        if _rental_move(rental, Rental.Status.ENDED, ends_at=upto):
            rental_bill(rental=rental, upto=upto, now=now)
    return rental


def rentals_settle(*, now: datetime | None = None) -> int:
    """End every live rental whose period is over (Celery beat); returns how many
    were found over (each ended once, ``rental_end``)."""
    now = now or timezone.now()
    over = list(Rental.objects.filter(status=Rental.Status.LIVE, ends_at__lte=now))
    for rental in over:
        rental_end(rental=rental, now=now)
    return len(over)


def rentals_watch(*, now: datetime | None = None) -> int:
    """Watch every live rental's device (Celery beat, ``rental_watch``): note
    its pauses, and stop the rentals whose device has been offline or paused
    for ``BALLAST_RENTAL_OFFLINE_END_S``, emailing each one's owner why (after
    the stop committed: a mail server down never keeps a rental open, and the
    machine page says it too). Returns how many were stopped."""
    now = now or timezone.now()
    live = Rental.objects.filter(status=Rental.Status.LIVE).values_list("id", flat=True)
    stopped = [
        rental
        for rental in (rental_watch(rental_id=rental_id, now=now) for rental_id in live)
        if rental is not None
    ]
    for rental in stopped:
        owner = rental.device.machine.owner
        if not owner.email:
            continue
        try:
            emails.rental_stopped(rental=rental)
        except Exception:
            log.exception("rental %s: the email to its host failed", rental.id)
    return len(stopped)


@transaction.atomic
def rental_watch(*, rental_id, now: datetime) -> Rental | None:
    """Look at a live rental's device at ``now`` and act on it, in one
    transaction on the locked row: a pause noted (``rental_pause_note``); a
    device away (offline, or paused) since ``rental_away_since`` for
    ``BALLAST_RENTAL_OFFLINE_END_S`` or more stops the rental (status
    ``stopped`` by compare-and-set, ``ends_at`` = ``now``, ``stop_reason`` for
    the renter and the host) and bills it for its live time (``rental_bill``).
    Returns the rental when this call stopped it, else None."""
    rental = _rental_locked(rental_id)
    if rental is None or rental.status != Rental.Status.LIVE:
        return None
    device = rental.device
    machine = device.machine
    paused = device.paused or machine.paused or machine.host_paused
    rental_pause_note(rental=rental, paused=paused, now=now)
    away_since, why = rental_away_since(rental=rental, now=now)
    limit = settings.BALLAST_RENTAL_OFFLINE_END_S
    if away_since is None or (now - away_since).total_seconds() < limit:
        return None
    reason = (
        f"the device was {why} from {away_since:%Y-%m-%d %H:%M:%S} UTC, longer"
        f" than {limit:g} s: the rental ended, billed only for the time the"
        " device was live"
    )
    if not _rental_move(
        rental, Rental.Status.STOPPED, ends_at=now, stop_reason=reason[:300]
    ):
        return None
    rental_bill(rental=rental, upto=now, now=now)
    return rental


def rental_away_since(*, rental: Rental, now: datetime) -> tuple[datetime | None, str]:
    """Since when the live rental's device has been away, and how (``offline``,
    ``paused`` or ``offline and paused``): offline since its machine was last
    seen (``Machine.seen_until``, the rental's start at the earliest), paused
    since the watch first saw it paused (``rental_paused_since``); (None, "")
    when it is live and not paused. Reads ``rental.device.machine.lease``."""
    machine = rental.device.machine
    since: list[tuple[datetime, str]] = []
    if not machine.is_online(now):
        seen = machine.seen_until()
        since.append(
            (max(seen, rental.starts_at) if seen else rental.starts_at, "offline")
        )
    paused_at = rental_paused_since(rental=rental)
    if paused_at is not None:
        since.append((paused_at, "paused"))
    if not since:
        return None, ""
    return min(at for at, _ in since), " and ".join(why for _, why in since)


def rental_bill(*, rental: Rental, upto: datetime | None, now: datetime) -> int:
    """Charge the renter for the locked rental's time from ``billed_until`` to
    ``upto`` that its device was live and not paused
    (``rentaltime.rental_live_amount_nano``, as of ``now``; one charge keyed
    by that period, ``rental_charge``) and move ``billed_until`` to ``upto`` by
    compare-and-set. Call inside the transaction holding the row (read by
    ``_rental_locked``). Returns nano-USD charged (0 when nothing is due). The
    host's share goes through the hold like any earning.
    """
    since = rental.billed_until
    if upto is None or since is None or upto <= since:
        return 0
    moved = Rental.objects.filter(id=rental.id, billed_until=since).update(
        billed_until=upto
    )
    if not moved:
        raise RuntimeError(f"rental {rental.id} billed by another writer")
    rental.billed_until = upto
    amount = rental_live_amount_nano(rental=rental, since=since, upto=upto, now=now)
    if amount > 0:
        rental_charge(rental=rental, amount_nano=amount, since=since, upto=upto)
    return amount
