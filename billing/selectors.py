"""Ledger reads: balances, statements, earnings, flags and the ledger audit.

Amounts are integer nano-USD. Balances are sums of entries (never stored).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from datetime import timezone as dt_timezone

from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import Count, F, Q, QuerySet, Sum
from django.db.models.functions import TruncDate

from .models import (
    Account,
    Earning,
    Entry,
    LedgerTransaction,
    PayoutRequest,
    ReceiptCheck,
)


def account_balance_nano(account: Account) -> int:
    """The account's balance: the sum of its entries, nano-USD."""
    return account.entries.aggregate(total=Sum("amount_nano"))["total"] or 0


def _user_balance(user: AbstractBaseUser, kind: str) -> int:
    total = Entry.objects.filter(account__kind=kind, account__user=user).aggregate(
        total=Sum("amount_nano")
    )["total"]
    return total or 0


def renter_balance_nano(*, user: AbstractBaseUser) -> int:
    """A renter's credit balance in nano-USD (0 with no account yet)."""
    return _user_balance(user, Account.Kind.RENTER_CREDIT)


def host_balances_nano(*, user: AbstractBaseUser) -> dict[str, int]:
    """A host's money in nano-USD.

    Keys: ``held`` (in the 24 h hold), ``available`` (may be paid out),
    ``paid_out`` (approved payouts), ``reversed`` (earnings taken back after a
    failed spot check), ``requested`` (payout requests waiting for staff) and
    ``requestable`` (available − requested, never below 0).
    """
    held = _user_balance(user, Account.Kind.HOST_HELD)
    available = _user_balance(user, Account.Kind.HOST_AVAILABLE)
    paid_out = _user_balance(user, Account.Kind.HOST_PAID_OUT)
    reversed_total = (
        Earning.objects.filter(host=user, status=Earning.Status.REVERSED).aggregate(
            total=Sum("amount_nano")
        )["total"]
        or 0
    )
    requested = (
        PayoutRequest.objects.filter(
            host=user, status=PayoutRequest.Status.REQUESTED
        ).aggregate(total=Sum("amount_nano"))["total"]
        or 0
    )
    return {
        "held": held,
        "available": available,
        "paid_out": paid_out,
        "reversed": reversed_total,
        "requested": requested,
        "requestable": max(0, available - requested),
    }


def renter_statement(*, user: AbstractBaseUser, limit: int = 200) -> QuerySet[Entry]:
    """The renter's credit account entries, newest first, with their transaction and job."""
    return (
        Entry.objects.filter(
            account__kind=Account.Kind.RENTER_CREDIT, account__user=user
        )
        .select_related("transaction", "transaction__job", "transaction__actor")
        .order_by("-transaction__created_at", "-id")[:limit]
    )


def renter_usage_by_model(*, user: AbstractBaseUser) -> list[dict]:
    """Charged usage per model: dicts of ``model``, ``jobs``, ``tokens``, ``cost_nano``
    (sums over the renter's jobs that have a charge in the ledger)."""
    rows = (
        LedgerTransaction.objects.filter(
            kind=LedgerTransaction.Kind.CHARGE, job__renter=user
        )
        .values("job__model_id")
        .annotate(
            jobs=Count("id"),
            tokens=Sum("job__tokens_billed"),
            cost_nano=Sum("job__cost_nano"),
        )
        .order_by("job__model_id")
    )
    return [
        {
            "model": r["job__model_id"],
            "jobs": r["jobs"],
            "tokens": r["tokens"],
            "cost_nano": r["cost_nano"],
        }
        for r in rows
    ]


def host_earnings(*, user: AbstractBaseUser, limit: int = 200) -> QuerySet[Earning]:
    """The host's earnings, newest first, with the attempt, job and device behind each."""
    return Earning.objects.filter(host=user).select_related(
        "attempt", "attempt__job", "device", "device__machine"
    )[:limit]


@dataclass(frozen=True)
class DeviceFlags:
    """Why a device's work was not believed: counts of flagged attempts by reason."""

    token_count: int
    receipt_missing: int
    receipt_invalid: int
    receipt_replayed: int

    @property
    def total(self) -> int:
        receipts = self.receipt_missing + self.receipt_invalid + self.receipt_replayed
        return self.token_count + receipts


def device_flags(*, device_id: int) -> DeviceFlags:
    """Count the device's flagged attempts: receipts by verdict, and receipted
    attempts (those that sent a ``done``) whose token count was not believed.

    One query over its receipt checks and their attempts; nothing is stored on
    the device.
    """
    counts = ReceiptCheck.objects.filter(device_id=device_id).aggregate(
        token_count=Count("id", filter=Q(attempt__token_count_flagged=True)),
        missing=Count("id", filter=Q(verdict=ReceiptCheck.Verdict.MISSING)),
        invalid=Count("id", filter=Q(verdict=ReceiptCheck.Verdict.INVALID)),
        replayed=Count("id", filter=Q(verdict=ReceiptCheck.Verdict.REPLAYED)),
    )
    return DeviceFlags(
        token_count=counts["token_count"],
        receipt_missing=counts["missing"],
        receipt_invalid=counts["invalid"],
        receipt_replayed=counts["replayed"],
    )


def transactions_unbalanced() -> list[int]:
    """Ids of ledger transactions whose entries do not sum to zero or miss declared legs.

    The service-level twin of the database checks (docs/money.md); empty on a
    healthy ledger.
    """
    rows = LedgerTransaction.objects.annotate(
        total=Sum("entries__amount_nano"), legs=Count("entries")
    ).filter(
        Q(total__isnull=True)
        | ~Q(total=0)
        | (Q(leg_count__gt=0) & ~Q(legs=F("leg_count")))
    )
    return list(rows.values_list("id", flat=True))


SPENDING_KINDS = (LedgerTransaction.Kind.CHARGE, LedgerTransaction.Kind.RENTAL)


def renter_spend_daily(
    *, user: AbstractBaseUser, now: datetime, days: int = 30
) -> list[tuple[date, int]]:
    """Per UTC day of the last ``days`` up to ``now``'s (oldest first): (date,
    nano-USD the renter was charged that day: jobs and rental time). Refunds
    are not subtracted (they are credit, shown on the statement)."""
    start = (now.astimezone(dt_timezone.utc) - timedelta(days=days - 1)).date()
    rows = (
        Entry.objects.filter(
            account__kind=Account.Kind.RENTER_CREDIT,
            account__user=user,
            transaction__kind__in=SPENDING_KINDS,
            transaction__created_at__gte=datetime.combine(
                start, time.min, tzinfo=dt_timezone.utc
            ),
        )
        .annotate(day=TruncDate("transaction__created_at", tzinfo=dt_timezone.utc))
        .values("day")
        .annotate(total=Sum("amount_nano"))
    )
    totals = {row["day"]: -(row["total"] or 0) for row in rows}
    return [
        (start + timedelta(days=i), totals.get(start + timedelta(days=i), 0))
        for i in range(days)
    ]
