"""A double-entry ledger in integer nano-USD (DESIGN.md "Money").

Every movement is a ``LedgerTransaction`` whose ``Entry`` amounts sum to zero.
Rows are append-only: corrections are new transactions. ``Earning`` tracks each
host segment's share through its 24 h hold (held → released, or reversed).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Account(models.Model):
    """A ledger account. Renter credit and host earnings are per user.

    Balance = sum of its entries (nano-USD). ``funding`` is where top-ups come from,
    ``platform`` takes fees and reversed earnings.
    """

    class Kind(models.TextChoices):
        RENTER_CREDIT = "renter_credit"
        HOST_HELD = "host_held"
        HOST_AVAILABLE = "host_available"
        HOST_PAID_OUT = "host_paid_out"
        PLATFORM = "platform"
        FUNDING = "funding"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="ledger_accounts",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["kind", "user"], name="account_unique_kind_user"),
            models.UniqueConstraint(
                fields=["kind"],
                condition=models.Q(user__isnull=True),
                name="account_unique_system_kind",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.user_id or 'system'}"


class LedgerTransaction(models.Model):
    """One balanced movement of money. ``key`` makes it idempotent (unique)."""

    class Kind(models.TextChoices):
        TOP_UP = "top_up"
        CHARGE = "charge"
        HOLD_RELEASE = "hold_release"
        EARNING_REVERSAL = "earning_reversal"
        PAYOUT = "payout"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    key = models.CharField(max_length=200, unique=True)
    job = models.ForeignKey(
        "jobs.Job", null=True, blank=True, on_delete=models.PROTECT, related_name="ledger"
    )
    memo = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.kind} {self.key}"


class Entry(models.Model):
    """One leg of a transaction: ``amount_nano`` > 0 credits, < 0 debits the account."""

    transaction = models.ForeignKey(
        LedgerTransaction, on_delete=models.PROTECT, related_name="entries"
    )
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="entries")
    amount_nano = models.BigIntegerField()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~models.Q(amount_nano=0), name="entry_nonzero")
        ]


class Earning(models.Model):
    """A host's share of one receipted segment (attempt), through its hold."""

    class Status(models.TextChoices):
        HELD = "held"
        RELEASED = "released"
        REVERSED = "reversed"

    attempt = models.OneToOneField(
        "jobs.Attempt", on_delete=models.PROTECT, related_name="earning"
    )
    device = models.ForeignKey("hosts.Device", on_delete=models.PROTECT, related_name="earnings")
    host = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="earnings"
    )
    amount_nano = models.BigIntegerField()
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.HELD, db_index=True
    )
    release_at = models.DateTimeField(db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
