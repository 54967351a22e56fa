"""Payouts: a host asks for available earnings, staff approve or reject, and an
approved payout is marked paid when the money was sent (DESIGN.md "Money").

requested → approved (the ledger moves host_available → host_paid_out) → paid,
or requested → rejected (nothing moves). Amounts are integer nano-USD.
"""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from ..models import Account, LedgerTransaction, PayoutRequest
from ..money import nano_to_usd_str
from ..selectors import account_balance_nano, host_balances_nano
from .ledger import account_for, ledger_post


class PayoutError(ValueError):
    """A payout request or decision that the rules refuse (amount, status)."""


def _host_available_locked(host: AbstractBaseUser) -> int:
    """Lock the host's available account row and return its balance (nano-USD)."""
    account = account_for(kind=Account.Kind.HOST_AVAILABLE, user=host)
    Account.objects.select_for_update().filter(id=account.id).first()
    return account_balance_nano(account)


@transaction.atomic
def payout_request(
    *, host: AbstractBaseUser, amount_nano: int, note: str = ""
) -> PayoutRequest:
    """Ask for ``amount_nano`` of the host's available earnings to be paid out.

    Allowed up to the available balance minus requests still waiting for staff.
    Raises PayoutError for an amount that is not positive or exceeds that.
    """
    if amount_nano <= 0:
        raise PayoutError("the amount must be positive")
    available = _host_available_locked(host)
    pending = host_balances_nano(user=host)["requested"]
    if amount_nano > available - pending:
        raise PayoutError(
            f"at most {nano_to_usd_str(max(0, available - pending))} USD can be requested now"
        )
    return PayoutRequest.objects.create(
        host=host, amount_nano=amount_nano, note=note[:300]
    )


@transaction.atomic
def payout_approve(
    *, payout_id: int, staff: AbstractBaseUser, now: datetime | None = None
) -> PayoutRequest:
    """Approve a requested payout: post host_available → host_paid_out (key ``payout:<id>``).

    Raises PayoutError when it is not ``requested`` or the host's available
    balance no longer covers it.
    """
    now = now or timezone.now()
    payout = (
        PayoutRequest.objects.select_for_update()
        .select_related("host")
        .get(id=payout_id)
    )
    if payout.status != PayoutRequest.Status.REQUESTED:
        raise PayoutError(f"payout {payout.id} is {payout.status}, not requested")
    available = _host_available_locked(payout.host)
    if payout.amount_nano > available:
        raise PayoutError(
            f"payout {payout.id}: {nano_to_usd_str(payout.amount_nano)} USD exceeds the "
            f"available {nano_to_usd_str(available)} USD"
        )
    ledger_post(
        kind=LedgerTransaction.Kind.PAYOUT,
        key=f"payout:{payout.id}",
        legs=[
            (
                account_for(kind=Account.Kind.HOST_AVAILABLE, user=payout.host),
                -payout.amount_nano,
            ),
            (
                account_for(kind=Account.Kind.HOST_PAID_OUT, user=payout.host),
                payout.amount_nano,
            ),
        ],
        memo=f"payout {payout.id} approved by {staff.get_username()}",
    )
    payout.status = PayoutRequest.Status.APPROVED
    payout.decided_at = now
    payout.decided_by = staff
    payout.save(update_fields=["status", "decided_at", "decided_by"])
    return payout


@transaction.atomic
def payout_reject(
    *, payout_id: int, staff: AbstractBaseUser, now: datetime | None = None
) -> PayoutRequest:
    """Reject a requested payout; no money moves. Raises PayoutError if not ``requested``."""
    now = now or timezone.now()
    payout = PayoutRequest.objects.select_for_update().get(id=payout_id)
    if payout.status != PayoutRequest.Status.REQUESTED:
        raise PayoutError(f"payout {payout.id} is {payout.status}, not requested")
    payout.status = PayoutRequest.Status.REJECTED
    payout.decided_at = now
    payout.decided_by = staff
    payout.save(update_fields=["status", "decided_at", "decided_by"])
    return payout


@transaction.atomic
def payout_mark_paid(*, payout_id: int, now: datetime | None = None) -> PayoutRequest:
    """Record that an approved payout's money was sent. Raises PayoutError otherwise."""
    now = now or timezone.now()
    payout = PayoutRequest.objects.select_for_update().get(id=payout_id)
    if payout.status != PayoutRequest.Status.APPROVED:
        raise PayoutError(f"payout {payout.id} is {payout.status}, not approved")
    payout.status = PayoutRequest.Status.PAID
    payout.paid_at = now
    payout.save(update_fields=["status", "paid_at"])
    return payout
