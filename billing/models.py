"""A double-entry ledger in integer nano-USD (DESIGN.md "Money").

Every movement is a ``LedgerTransaction`` whose ``Entry`` amounts sum to zero.
Rows are append-only: corrections are new transactions. ``Earning`` tracks each
host segment's share through its 24 h hold (held → released, or reversed).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class AppendOnlyError(RuntimeError):
    """An UPDATE or DELETE of a ledger row was attempted (corrections are new entries)."""


class AppendOnlyQuerySet(models.QuerySet):
    """A queryset that refuses ``update()`` and ``delete()`` (the ledger is append-only)."""

    def update(self, **kwargs):
        raise AppendOnlyError(f"{self.model.__name__} rows are append-only: no update")

    def delete(self):
        raise AppendOnlyError(f"{self.model.__name__} rows are append-only: no delete")

    update.queryset_only = True
    delete.queryset_only = True


class AppendOnlyModel(models.Model):
    """Rows are inserted once and never changed or removed through the ORM.

    ``save()`` on an existing row and ``delete()`` raise AppendOnlyError, as do the
    queryset's ``update()``/``delete()``. The database backs this on PostgreSQL
    with triggers (billing migration 0002).
    """

    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise AppendOnlyError(
                f"{type(self).__name__} rows are append-only: no update"
            )
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnlyError(f"{type(self).__name__} rows are append-only: no delete")


class Account(models.Model):
    """A ledger account. Renter credit and host earnings are per user.

    Balance = sum of its entries (nano-USD). ``funding`` is where top-ups come from,
    ``platform`` takes fees and reversed earnings, ``platform_checks`` pays the
    hosts of spot checks.

    ``balance_nano`` is that sum kept running by the database (a trigger on every
    entry inserted, billing migration 0004) for **renter credit accounts only**: the
    credit check of every request reads it instead of summing the renter's whole
    history. It is never written by Python. Other kinds keep 0 (a running total on
    the platform account would make every charge wait for the one before it).
    """

    class Kind(models.TextChoices):
        RENTER_CREDIT = "renter_credit"
        HOST_HELD = "host_held"
        HOST_AVAILABLE = "host_available"
        HOST_PAID_OUT = "host_paid_out"
        PLATFORM = "platform"
        FUNDING = "funding"
        # what the platform pays hosts for passed spot checks (nobody is billed)
        PLATFORM_CHECKS = "platform_checks"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="ledger_accounts",
    )
    balance_nano = models.BigIntegerField(default=0, editable=False)
    # the low-balance email of a renter credit account (docs/money.md "Low
    # balance"): the renter's own threshold (None: BALLAST_LOW_BALANCE_USD; 0:
    # never), when the balance went under it (None: not under it since the
    # last credit), and when that was emailed (once per crossing)
    low_balance_nano = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="email the renter when the balance falls below this, nano-USD "
        "(empty: BALLAST_LOW_BALANCE_USD; 0: never)",
    )
    low_balance_at = models.DateTimeField(null=True, blank=True, editable=False)
    low_balance_emailed_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "user"], name="account_unique_kind_user"
            ),
            models.UniqueConstraint(
                fields=["kind"],
                condition=models.Q(user__isnull=True),
                name="account_unique_system_kind",
            ),
        ]

    def save(self, *args, **kwargs):
        """Save; an existing account never writes ``balance_nano`` (the database's)."""
        if not self._state.adding and kwargs.get("update_fields") is None:
            kwargs["update_fields"] = [
                f.name
                for f in self._meta.concrete_fields
                if not f.primary_key and f.name != "balance_nano"
            ]
        super().save(*args, **kwargs)

    def __str__(self) -> str:
        return f"{self.kind}:{self.user_id or 'system'}"


class LedgerTransaction(AppendOnlyModel):
    """One balanced movement of money. ``key`` makes it idempotent (unique).

    ``leg_count`` is the number of entries the transaction was written with; the
    database checks that exactly that many entries exist and sum to zero
    (PostgreSQL: a deferred constraint trigger at commit; SQLite: a trigger when
    the last leg is inserted). See docs/money.md.
    """

    class Kind(models.TextChoices):
        TOP_UP = "top_up"
        CHARGE = "charge"
        HOLD_RELEASE = "hold_release"
        EARNING_REVERSAL = "earning_reversal"
        PAYOUT = "payout"
        RENTAL = "rental"
        REFUND = "refund"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    key = models.CharField(max_length=200, unique=True)
    job = models.ForeignKey(
        "jobs.Job",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="ledger",
    )
    memo = models.CharField(max_length=300, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="ledger_actions",
        help_text="the staff member who made this movement (a top-up, a refund), "
        "if one did; ``memo`` says why",
    )
    leg_count = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.key}"


class Entry(AppendOnlyModel):
    """One leg of a transaction: ``amount_nano`` > 0 credits, < 0 debits the account."""

    transaction = models.ForeignKey(
        LedgerTransaction, on_delete=models.PROTECT, related_name="entries"
    )
    account = models.ForeignKey(
        Account, on_delete=models.PROTECT, related_name="entries"
    )
    amount_nano = models.BigIntegerField()

    class Meta:
        verbose_name_plural = "entries"
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(amount_nano=0), name="entry_nonzero"
            )
        ]

    def __str__(self) -> str:
        return f"entry {self.id}: {self.amount_nano:+d} nano-USD"


class Earning(models.Model):
    """A host's share of one receipted segment (attempt), through its hold."""

    class Status(models.TextChoices):
        HELD = "held"
        RELEASED = "released"
        REVERSED = "reversed"

    attempt = models.OneToOneField(
        "jobs.Attempt",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="earning",
    )
    rental = models.ForeignKey(
        "jobs.Rental",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="earnings",
    )
    device = models.ForeignKey(
        "hosts.Device", on_delete=models.PROTECT, related_name="earnings"
    )
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
        ordering = ["-created_at", "-id"]


class ReceiptCheck(models.Model):
    """The verdict on the receipt of one attempt's ``done`` (PROTOCOL.md §2).

    ``signature`` is unique: the same signature presented again (for another
    attempt, or a second ``done``) is a replay and pays nothing. Only a ``valid``
    verdict lets the attempt's host be paid.
    """

    class Verdict(models.TextChoices):
        VALID = "valid"
        MISSING = "missing"
        INVALID = "invalid"  # bad signature, or a hash that does not match the text
        REPLAYED = "replayed"

    attempt = models.OneToOneField(
        "jobs.Attempt", on_delete=models.PROTECT, related_name="receipt_check"
    )
    device = models.ForeignKey(
        "hosts.Device", on_delete=models.PROTECT, related_name="receipt_checks"
    )
    signature = models.CharField(max_length=200, null=True, blank=True, unique=True)
    verdict = models.CharField(max_length=10, choices=Verdict.choices, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"receipt of {self.attempt_id}: {self.verdict}"


class PayoutRequest(models.Model):
    """A host's request to be paid out ``amount_nano`` of their available earnings.

    requested → approved (staff; the ledger moves host_available → host_paid_out)
    → paid (the money was sent), or requested → rejected (nothing moves).
    """

    class Status(models.TextChoices):
        REQUESTED = "requested"
        APPROVED = "approved"
        REJECTED = "rejected"
        PAID = "paid"

    host = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="payout_requests",
    )
    amount_nano = models.BigIntegerField()
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.REQUESTED, db_index=True
    )
    note = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="payouts_decided",
    )
    paid_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(amount_nano__gt=0), name="payout_amount_positive"
            )
        ]

    def __str__(self) -> str:
        return f"payout {self.id} of {self.host_id}: {self.amount_nano} ({self.status})"


class RenterCredit(Account):
    """Renter credit accounts, as staff top them up and refund them in the admin
    (``billing.admin_credit``). Only renter credit accounts are shown there."""

    class Meta:
        proxy = True
        verbose_name = "renter credit"
        verbose_name_plural = "renter credit (top up, refund)"


class CreditCode(models.Model):
    """A code a renter redeems for ``amount_nano`` of credit (docs/money.md
    "Credit codes").

    Redeemable ``max_redemptions`` times in all (by as many renters, each once),
    until ``expires_at`` (None: never) and while ``active``. ``redeemed_count``
    is counted under the row's lock by ``billing.services.credit_code_redeem``.
    ``code`` is kept upper case; renters type it in any case.
    """

    code = models.CharField(max_length=40, unique=True)
    amount_nano = models.BigIntegerField()
    max_redemptions = models.PositiveIntegerField(default=1)
    redeemed_count = models.PositiveIntegerField(default=0, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    active = models.BooleanField(default=True)
    memo = models.CharField(
        max_length=300, blank=True, help_text="why it was made (shown to staff)"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="credit_codes_made",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(amount_nano__gt=0),
                name="credit_code_amount_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(max_redemptions__gt=0),
                name="credit_code_uses_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(redeemed_count__lte=models.F("max_redemptions")),
                name="credit_code_not_overused",
            ),
        ]

    def __str__(self) -> str:
        return self.code


class CreditCodeRedemption(models.Model):
    """One renter's redemption of a code, with the ledger transaction that
    credited it (unique per code and renter: a renter redeems a code once)."""

    code = models.ForeignKey(
        CreditCode, on_delete=models.PROTECT, related_name="redemptions"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="credit_code_redemptions",
    )
    transaction = models.OneToOneField(
        LedgerTransaction, on_delete=models.PROTECT, related_name="code_redemption"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["code", "user"], name="credit_code_once_per_renter"
            )
        ]
