"""Renter credit coming in and given back: top-ups from any source, and refunds
(docs/money.md "Adding credit").

``credit_add`` is the one way credit is added: staff in the admin, a credit
code, the operator's command and, later, a payment provider's webhook all call
it with their ``source`` and a ``reference`` of their own, so the same payment
delivered twice credits once. ``credit_refund`` gives charged credit back
from the platform. Amounts are integer nano-USD.
"""

from __future__ import annotations

import re

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.db.models import Sum

from ..models import Account, Entry, LedgerTransaction
from ..money import NANO_PER_USD
from ..templatetags.billing_money import usd_text
from .ledger import account_for, ledger_post

TOP_UP_MAX_NANO = 1_000_000 * NANO_PER_USD  # one million USD


class CreditSource:
    """Who adds credit (``credit_add``'s ``source``). A payment provider's webhook
    uses its own name (``"stripe"``) and its payment's id as the reference."""

    STAFF = "staff"  # a top-up in the admin: the staff member is the actor
    CODE = "code"  # a credit code a renter redeemed (billing.services.codes)
    OPERATOR = "operator"  # `manage.py renter_create --credit` and scripts


class CreditError(ValueError):
    """A top-up or refund the rules refuse (amount, source, what is refundable)."""


_SOURCE = re.compile(r"[a-z][a-z0-9_-]{0,29}")
_REFERENCE = re.compile(r"[\x21-\x7e]{1,150}")  # printable ASCII, no spaces


def _amount_check(amount_nano: int, what: str) -> None:
    if not isinstance(amount_nano, int) or amount_nano <= 0:
        raise CreditError(f"{what} must be more than $0.00")
    if amount_nano > TOP_UP_MAX_NANO:
        raise CreditError(f"{what} must be at most {usd_text(TOP_UP_MAX_NANO)}")


@transaction.atomic
def credit_add(
    *,
    user: AbstractBaseUser,
    amount_nano: int,
    source: str,
    reference: str,
    memo: str = "",
    actor: AbstractBaseUser | None = None,
) -> LedgerTransaction | None:
    """Add ``amount_nano`` (> 0, at most ``TOP_UP_MAX_NANO``) to the renter's
    credit from the funding account: one ``top_up`` transaction keyed
    ``credit:<source>:<reference>``; returns it, or None when that key was
    posted before (a webhook delivered twice, a form sent twice).

    ``source``: a ``CreditSource`` value or a payment provider's name (lower
    case, ``[a-z][a-z0-9_-]``, ≤ 30); ``reference``: the source's own id for
    this credit (printable ASCII without spaces, ≤ 150); ``memo``: why, shown
    on the renter's statement (≤ 300); ``actor``: the staff member who did it.
    Raises CreditError for a bad amount, source or reference. The bound keeps
    every balance far inside the ledger's 64-bit integers.
    """
    _amount_check(amount_nano, "a top-up")
    if not _SOURCE.fullmatch(source or ""):
        raise CreditError(f"source {source!r} must be a lower-case name")
    if not _REFERENCE.fullmatch(reference or ""):
        raise CreditError("the reference must be 1–150 printable characters")
    return ledger_post(
        kind=LedgerTransaction.Kind.TOP_UP,
        key=f"credit:{source}:{reference}",
        legs=[
            (account_for(kind=Account.Kind.FUNDING), -amount_nano),
            (account_for(kind=Account.Kind.RENTER_CREDIT, user=user), amount_nano),
        ],
        memo=memo or "credit top-up",
        actor=actor,
    )


def renter_top_up(
    *, user: AbstractBaseUser, amount_nano: int, key: str
) -> LedgerTransaction | None:
    """``credit_add`` from the operator (``CreditSource.OPERATOR``) with ``key``
    as the reference: scripts, the demo and tests. Raises CreditError (a
    ValueError) as ``credit_add``."""
    return credit_add(
        user=user, amount_nano=amount_nano, source=CreditSource.OPERATOR, reference=key
    )


def _renter_total(account: Account, kinds: list[str], **extra) -> int:
    """Sum of the account's entries of transactions of these kinds, nano-USD."""
    total = Entry.objects.filter(
        account=account, transaction__kind__in=kinds, **extra
    ).aggregate(total=Sum("amount_nano"))["total"]
    return total or 0


def credit_refundable_nano(*, user: AbstractBaseUser, job_id=None) -> int:
    """What may still be refunded to the renter, nano-USD: what they were charged
    (jobs and rental time) less what was refunded; of one job when ``job_id``
    (UUID or str) is given (its charge less its refunds)."""
    account = account_for(kind=Account.Kind.RENTER_CREDIT, user=user)
    charges = [LedgerTransaction.Kind.CHARGE, LedgerTransaction.Kind.RENTAL]
    refunds = [LedgerTransaction.Kind.REFUND]
    if job_id is None:
        return -_renter_total(account, charges) - _renter_total(account, refunds)
    of_job = {"transaction__job_id": job_id}
    return -_renter_total(account, charges, **of_job) - _renter_total(
        account, refunds, **of_job
    )


@transaction.atomic
def credit_refund(
    *,
    user: AbstractBaseUser,
    amount_nano: int,
    reason: str,
    actor: AbstractBaseUser,
    reference: str,
    job_id=None,
) -> LedgerTransaction | None:
    """Give the renter back ``amount_nano`` of what they were charged: one
    ``refund`` transaction keyed ``refund:<reference>``, platform −amount,
    renter credit +amount (the hosts keep what they earned: they did the
    work). Returns it, or None when that reference was refunded before.

    ``reason``: why (required, ≤ 300; shown on the renter's statement);
    ``actor``: the staff member; ``job_id``: the job refunded, if one (then at
    most its charge less its refunds, else at most all the renter's charges
    less all refunds). The renter's credit account is locked, so two refunds
    at once cannot pass the bound together. Raises CreditError.
    """
    _amount_check(amount_nano, "a refund")
    reason = (reason or "").strip()
    if not reason:
        raise CreditError("say why the refund is made")
    if not _REFERENCE.fullmatch(reference or ""):
        raise CreditError("the reference must be 1–150 printable characters")
    credit = account_for(kind=Account.Kind.RENTER_CREDIT, user=user)
    Account.objects.select_for_update().filter(id=credit.id).first()
    if LedgerTransaction.objects.filter(key=f"refund:{reference}").exists():
        return None  # sent twice: the first stands (and the bound may be used up)
    refundable = credit_refundable_nano(user=user, job_id=job_id)
    if amount_nano > refundable:
        what = f"job {job_id}" if job_id else "this renter"
        raise CreditError(
            f"at most {usd_text(max(0, refundable))} can be refunded to {what} "
            "(what was charged, less earlier refunds)"
        )
    return ledger_post(
        kind=LedgerTransaction.Kind.REFUND,
        key=f"refund:{reference}",
        legs=[
            (account_for(kind=Account.Kind.PLATFORM), -amount_nano),
            (credit, amount_nano),
        ],
        job_id=job_id,
        memo=reason,
        actor=actor,
    )
