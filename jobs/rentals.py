"""Rentals: a device reserved for one renter, checked before and during (DESIGN.md).

``pending`` until a spot check passes, then ``live`` for its hours; a failed check
``stopped``s it and the renter pays only up to the last passed check; it ``ended``s
at its end or when the renter ends it. Billed per hour through the ledger.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from billing.money import usd_to_nano
from hosts.models import Device
from hosts.services import spot_check_mark_due

from .errors import ApiError
from .models import Rental
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

    Raises ApiError 400 (hours), 404 (no such live device), 409 (already rented or
    quarantined), 402 (balance below the whole period's price).
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
        .select_for_update(of=("self",))  # SQLite: its one writer
        .filter(id=device_id)
        .first()
    )
    if device is None:
        raise ApiError(404, f"no live device {device_id}", "device_not_found", "device")
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


def rentals_after_check(*, device_id: int, passed: bool, now: datetime) -> None:
    """Apply a spot check's verdict to the device's open rental (pending or live)."""
    rental = device_rented(device_id)
    if rental is None:
        return
    if passed:
        if rental.status == Rental.Status.PENDING:
            Rental.objects.filter(id=rental.id, status=Rental.Status.PENDING).update(
                status=Rental.Status.LIVE,
                starts_at=now,
                ends_at=now + timedelta(hours=rental.hours),
                last_pass_at=now,
                last_check_at=now,
                billed_until=now,
            )
        else:
            Rental.objects.filter(id=rental.id).update(
                last_pass_at=now, last_check_at=now
            )
        return
    Rental.objects.filter(id=rental.id).update(
        status=Rental.Status.STOPPED,
        last_check_at=now,
        stop_reason="a spot check failed",
    )
    if rental.status == Rental.Status.LIVE:
        rental.refresh_from_db()
        rental_bill(rental=rental, upto=rental.last_pass_at)


def rental_end(*, rental: Rental, now: datetime | None = None) -> Rental:
    """End a rental (the renter's choice, or its period is over) and bill it."""
    now = now or timezone.now()
    if rental.status == Rental.Status.PENDING:
        Rental.objects.filter(id=rental.id).update(
            status=Rental.Status.ENDED, stop_reason="ended before going live"
        )
    elif rental.status == Rental.Status.LIVE:
        upto = min(now, rental.ends_at)
        Rental.objects.filter(id=rental.id, status=Rental.Status.LIVE).update(
            status=Rental.Status.ENDED, ends_at=upto
        )
        rental_bill(rental=rental, upto=upto)
    rental.refresh_from_db()
    return rental


def rentals_settle(*, now: datetime | None = None) -> int:
    """End every live rental whose period is over (Celery beat); returns how many."""
    now = now or timezone.now()
    ended = 0
    for rental in Rental.objects.filter(status=Rental.Status.LIVE, ends_at__lte=now):
        rental_end(rental=rental, now=now)
        ended += 1
    return ended


def rental_bill(*, rental: Rental, upto: datetime | None) -> int:
    """Charge the renter for the rental's time from ``billed_until`` to ``upto``.

    Returns nano-USD charged (0 when nothing is due). The host's share goes through
    the hold like any earning.
    """
    from billing.services import rental_charge

    if upto is None or rental.billed_until is None or upto <= rental.billed_until:
        return 0
    seconds = Decimal((upto - rental.billed_until).total_seconds())
    amount = int(seconds * rental.price_per_hour_nano / 3600)
    if amount > 0:
        rental_charge(rental=rental, amount_nano=amount, upto=upto)
    Rental.objects.filter(id=rental.id).update(billed_until=upto)
    return amount
