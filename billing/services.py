"""Ledger writes: top-ups, job charges with host earnings, hold release, reversals.

Every function writes one balanced transaction (entries sum to zero) under a
unique idempotency key, so a retry or a concurrent duplicate writes nothing
twice (DESIGN.md "Money").
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from .models import Account, Earning, Entry, LedgerTransaction
from .money import share_of


class UnbalancedTransaction(ValueError):
    """The legs of a ledger transaction do not sum to zero."""


def account_for(*, kind: str, user: AbstractBaseUser | None = None) -> Account:
    """Return the ledger account of this kind (per user, or the system one)."""
    account, _ = Account.objects.get_or_create(kind=kind, user=user)
    return account


def account_balance_nano(account: Account) -> int:
    """The account's balance: the sum of its entries, nano-USD."""
    return account.entries.aggregate(total=Sum("amount_nano"))["total"] or 0


def renter_balance_nano(*, user: AbstractBaseUser) -> int:
    """A renter's credit balance in nano-USD (0 with no account yet)."""
    total = Entry.objects.filter(
        account__kind=Account.Kind.RENTER_CREDIT, account__user=user
    ).aggregate(total=Sum("amount_nano"))["total"]
    return total or 0


def ledger_post(
    *, kind: str, key: str, legs: list[tuple[Account, int]], job=None, memo: str = ""
) -> LedgerTransaction | None:
    """Write one balanced transaction; return it, or None if ``key`` was already posted.

    ``legs`` are (account, nano-USD) pairs; zero legs are dropped. Raises
    UnbalancedTransaction when the legs do not sum to zero.
    """
    legs = [(account, amount) for account, amount in legs if amount]
    if sum(amount for _, amount in legs) != 0:
        raise UnbalancedTransaction(f"{kind} {key}: legs sum to {sum(a for _, a in legs)}")
    try:
        with transaction.atomic():
            txn = LedgerTransaction.objects.create(kind=kind, key=key, job=job, memo=memo)
            Entry.objects.bulk_create(
                [Entry(transaction=txn, account=account, amount_nano=amount) for account, amount in legs]
            )
    except IntegrityError:
        if LedgerTransaction.objects.filter(key=key).exists():
            return None
        raise
    return txn


@transaction.atomic
def renter_top_up(*, user: AbstractBaseUser, amount_nano: int, key: str) -> LedgerTransaction | None:
    """Credit a renter with ``amount_nano`` from the funding account (idempotent on key)."""
    if amount_nano <= 0:
        raise ValueError("a top-up must be positive")
    return ledger_post(
        kind=LedgerTransaction.Kind.TOP_UP,
        key=key,
        legs=[
            (account_for(kind=Account.Kind.FUNDING), -amount_nano),
            (account_for(kind=Account.Kind.RENTER_CREDIT, user=user), amount_nano),
        ],
        memo="credit top-up",
    )


@transaction.atomic
def job_charge(*, job, now: datetime | None = None) -> LedgerTransaction | None:
    """Charge the renter for what the job delivered and credit hosts' holds.

    One transaction per job (key ``charge:<job id>``): renter −cost, each
    receipted segment's host +80 % of that segment (an ``Earning`` held for
    ``BALLAST_HOLD_HOURS``), platform the rest. Spot checks and zero costs post
    nothing. Returns None when there is nothing to post or it was posted before.
    """
    if job.is_spot_check or job.renter_id is None or job.cost_nano <= 0:
        return None
    now = now or timezone.now()
    from jobs.models import CatalogModel

    price = CatalogModel.objects.get(id=job.model_id).price_completion_nano
    legs: list[tuple[Account, int]] = [
        (account_for(kind=Account.Kind.RENTER_CREDIT, user=job.renter), -job.cost_nano)
    ]
    earnings = []
    host_total = 0
    for attempt in job.attempts.select_related("device__machine__owner"):
        if not attempt.receipt_valid or attempt.tokens_billed <= 0:
            continue
        share = share_of(attempt.tokens_billed * price, settings.BALLAST_HOST_SHARE)
        if share <= 0:
            continue
        host = attempt.device.machine.owner
        legs.append((account_for(kind=Account.Kind.HOST_HELD, user=host), share))
        host_total += share
        earnings.append(
            Earning(
                attempt=attempt,
                device=attempt.device,
                host=host,
                amount_nano=share,
                release_at=now + timedelta(hours=settings.BALLAST_HOLD_HOURS),
            )
        )
    legs.append((account_for(kind=Account.Kind.PLATFORM), job.cost_nano - host_total))
    txn = ledger_post(
        kind=LedgerTransaction.Kind.CHARGE,
        key=f"charge:{job.id}",
        legs=legs,
        job=job,
        memo=f"{job.tokens_billed} tokens of {job.model_id}",
    )
    if txn is not None:
        Earning.objects.bulk_create(earnings)
    return txn


def holds_release(*, now: datetime | None = None) -> int:
    """Move every earning whose hold has ended from held to available; return the count.

    Each earning is released by a compare-and-set on its status, so two workers
    never release one twice.
    """
    now = now or timezone.now()
    released = 0
    for earning in Earning.objects.filter(status=Earning.Status.HELD, release_at__lte=now):
        with transaction.atomic():
            if not Earning.objects.filter(id=earning.id, status=Earning.Status.HELD).update(
                status=Earning.Status.RELEASED, settled_at=now
            ):
                continue
            ledger_post(
                kind=LedgerTransaction.Kind.HOLD_RELEASE,
                key=f"release:{earning.id}",
                legs=[
                    (account_for(kind=Account.Kind.HOST_HELD, user=earning.host), -earning.amount_nano),
                    (account_for(kind=Account.Kind.HOST_AVAILABLE, user=earning.host), earning.amount_nano),
                ],
                memo=f"hold ended for attempt {earning.attempt_id}",
            )
            released += 1
    return released


def earnings_reverse_held(*, device_id: int, reason: str, now: datetime | None = None) -> int:
    """Reverse every earning of the device still in its hold (a failed spot check).

    Ledger entries move each amount from the host's held account to the platform;
    returns how many earnings were reversed.
    """
    now = now or timezone.now()
    reversed_count = 0
    for earning in Earning.objects.filter(device_id=device_id, status=Earning.Status.HELD):
        with transaction.atomic():
            if not Earning.objects.filter(id=earning.id, status=Earning.Status.HELD).update(
                status=Earning.Status.REVERSED, settled_at=now
            ):
                continue
            ledger_post(
                kind=LedgerTransaction.Kind.EARNING_REVERSAL,
                key=f"reversal:{earning.id}",
                legs=[
                    (account_for(kind=Account.Kind.HOST_HELD, user=earning.host), -earning.amount_nano),
                    (account_for(kind=Account.Kind.PLATFORM), earning.amount_nano),
                ],
                memo=reason[:300],
            )
            reversed_count += 1
    return reversed_count
