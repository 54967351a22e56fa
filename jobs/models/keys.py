"""Renters' API keys and their spending caps (docs/money.md "Spending caps")."""

from __future__ import annotations

from datetime import datetime
from datetime import timezone as dt_timezone

from django.conf import settings
from django.db import models


class ApiKey(models.Model):
    """A renter's API key, stored as a sha256 hash; the plain key is shown once.

    A key may have a spending cap (docs/money.md "Spending caps"): at most
    ``spend_cap_nano`` charged in each ``spend_cap_period`` (a UTC day, a UTC
    calendar month, or ever). ``spent_nano`` is what its jobs were charged
    since ``spent_since`` (the start of the period it counts), kept by
    ``jobs.services.caps`` while a cap is set.
    """

    class Period(models.TextChoices):
        DAY = "day", "per day (UTC)"
        MONTH = "month", "per calendar month (UTC)"
        TOTAL = "total", "in total"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100, default="default")
    prefix = models.CharField(max_length=16)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    spend_cap_nano = models.BigIntegerField(null=True, blank=True)
    spend_cap_period = models.CharField(
        max_length=8, choices=Period.choices, default=Period.MONTH
    )
    spent_nano = models.BigIntegerField(default=0)
    spent_since = models.DateTimeField(null=True, blank=True)
    # when an answer of this key last came back empty (``jobs.services.requests.
    # key_empty_answer_record``): a key with none within the window of
    # ``BALLAST_EMPTY_ANSWER_RATE`` cannot be past it, and its requests do not
    # ask the limit's counter (``key_empty_answers_check``)
    last_empty_answer_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"

    def spend_period_start(self, now: datetime) -> datetime:
        """The start of the cap's period that holds ``now`` (aware UTC): midnight
        UTC of that day, the first of that month, or the epoch for ``total``."""
        now = now.astimezone(dt_timezone.utc)
        if self.spend_cap_period == self.Period.DAY:
            return now.replace(hour=0, minute=0, second=0, microsecond=0)
        if self.spend_cap_period == self.Period.MONTH:
            return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        return SPEND_EPOCH

    def spent_in_period_nano(self, now: datetime) -> int:
        """What the key was charged in the period holding ``now``, nano-USD (0
        when its counter belongs to an earlier period)."""
        if self.spent_since is None or self.spent_since != self.spend_period_start(now):
            return 0
        return self.spent_nano


SPEND_EPOCH = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)  # a total cap's period
