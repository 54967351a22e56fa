"""The hold: a host's earning waits ``BALLAST_HOLD_HOURS`` before it is available,
and a failed spot check reverses what is still held (DESIGN.md "Money")."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from ..models import Account, Earning, LedgerTransaction
from .ledger import account_for, ledger_post


def _earning_settle(
    earning: Earning,
    *,
    status: str,
    kind: str,
    key: str,
    to_account: Account,
    memo: str,
    now: datetime,
) -> bool:
    """Move a held earning out of the hold (released or reversed), once.

    A compare-and-set on its status inside its own transaction, then one balanced
    ledger transaction (of the earning's job, if any) from the host's held account
    to ``to_account``. Returns False when another worker settled it first.
    """
    with transaction.atomic():
        if not Earning.objects.filter(id=earning.id, status=Earning.Status.HELD).update(
            status=status, settled_at=now
        ):
            return False
        ledger_post(
            kind=kind,
            key=key,
            legs=[
                (
                    account_for(kind=Account.Kind.HOST_HELD, user_id=earning.host_id),
                    -earning.amount_nano,
                ),
                (to_account, earning.amount_nano),
            ],
            job_id=earning.attempt.job_id if earning.attempt_id else None,
            memo=memo,
        )
    return True


def holds_release(*, now: datetime | None = None) -> int:
    """Move every earning whose hold has ended from held to available; return the count.

    Each earning is released in its own transaction by a compare-and-set on its
    status (and posted under key ``release:<earning id>``), so two workers never
    release one twice and one failure does not hold back the others.
    """
    now = now or timezone.now()
    released = 0
    due = Earning.objects.filter(status=Earning.Status.HELD, release_at__lte=now)
    for earning in due.select_related("attempt"):
        released += _earning_settle(
            earning,
            status=Earning.Status.RELEASED,
            kind=LedgerTransaction.Kind.HOLD_RELEASE,
            key=f"release:{earning.id}",
            to_account=account_for(
                kind=Account.Kind.HOST_AVAILABLE, user_id=earning.host_id
            ),
            memo=(
                f"hold ended for attempt {earning.attempt_id}"
                if earning.attempt_id
                else f"hold ended for rental {earning.rental_id}"
            ),
            now=now,
        )
    return released


def earnings_reverse_held(
    *, machine_id, reason: str, now: datetime | None = None
) -> int:
    """Reverse every earning still in its hold of every device the machine has
    had, retired ones included (a failed check of one of them: DESIGN.md "Fair
    to honest hosts", held earnings belong to the machine, not to a device
    index a host can rename).

    Each amount moves from the host's held account to the platform (key
    ``reversal:<earning id>``, memo ``reason``); released earnings are not
    touched. The renter's charge stands: they received the output. Returns how
    many were reversed.
    """
    now = now or timezone.now()
    reversed_count = 0
    held = Earning.objects.filter(
        device__machine_id=machine_id, status=Earning.Status.HELD
    )
    for earning in held.select_related("attempt"):
        reversed_count += _earning_settle(
            earning,
            status=Earning.Status.REVERSED,
            kind=LedgerTransaction.Kind.EARNING_REVERSAL,
            key=f"reversal:{earning.id}",
            to_account=account_for(kind=Account.Kind.PLATFORM),
            memo=reason,
            now=now,
        )
    return reversed_count
