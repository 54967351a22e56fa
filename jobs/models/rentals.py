"""Rentals: a device reserved for one renter for a period (DESIGN.md "Rentals")."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class Rental(models.Model):
    """A device reserved for one renter for a period, checked before and during.

    Goes ``pending`` → ``live`` after a passed spot check; ``stopped`` by a failed
    check (billed only up to the last pass) or by its device offline or paused
    for ``BALLAST_RENTAL_OFFLINE_END_S``; ``ended`` at its end or by the renter.
    Priced per hour in nano-USD, billed for the time its device was live and
    not paused (``jobs.rentaltime``).
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        LIVE = "live"
        STOPPED = "stopped"
        ENDED = "ended"

    OPEN_STATUSES = (Status.PENDING, Status.LIVE)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    renter = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="rentals"
    )
    device = models.ForeignKey(
        "hosts.Device", on_delete=models.PROTECT, related_name="rentals"
    )
    hours = models.PositiveIntegerField()
    price_per_hour_nano = models.BigIntegerField()
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    starts_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True)
    last_pass_at = models.DateTimeField(null=True, blank=True)
    last_check_at = models.DateTimeField(null=True, blank=True)
    billed_until = models.DateTimeField(null=True, blank=True)
    stop_reason = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"rental {self.id} ({self.status})"


class RentalPause(models.Model):
    """A stretch of a live rental during which its device was paused (by its
    owner, its agent or staff), as the beat task ``jobs.rentals.rentals_watch``
    saw it: not billed (``jobs.rentaltime``). ``ended_at`` is None while the
    pause lasts."""

    rental = models.ForeignKey(Rental, on_delete=models.CASCADE, related_name="pauses")
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["started_at"]

    def __str__(self) -> str:
        return f"pause of {self.rental_id} from {self.started_at:%H:%M:%S}"
