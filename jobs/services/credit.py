"""A renter's credit: the balance less what open commitments may still cost
(DESIGN.md "Money": the worst case is held before an offer goes out)."""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser

from billing.models import Account
from billing.services import account_for
from catalog.models import CatalogModel

from ..models import Job, Rental


def credit_reserved_nano(*, renter: AbstractBaseUser) -> int:
    """What the renter's open commitments may still cost, nano-USD.

    The worst case (``max_tokens`` × the price each was admitted at) of their
    open jobs, plus the unbilled hours of their pending and live rentals.
    """
    open_jobs = list(
        Job.objects.filter(renter=renter, status__in=Job.OPEN_STATUSES).values_list(
            "model_id", "params", "price_completion_nano"
        )
    )
    missing = {model_id for model_id, _, admitted in open_jobs if admitted is None}
    prices = (
        dict(
            CatalogModel.objects.filter(id__in=missing).values_list(
                "id", "price_completion_nano"
            )
        )
        if missing
        else {}
    )
    jobs = sum(
        (params.get("max_tokens") or 0)
        * (admitted if admitted is not None else prices.get(model_id, 0))
        for model_id, params, admitted in open_jobs
    )
    rentals = 0
    for rental in Rental.objects.filter(renter=renter, status__in=Rental.OPEN_STATUSES):
        hours_left = float(rental.hours)
        if rental.billed_until and rental.starts_at:
            billed = (rental.billed_until - rental.starts_at).total_seconds() / 3600
            hours_left = max(0.0, rental.hours - billed)
        rentals += int(hours_left * rental.price_per_hour_nano)
    return jobs + rentals


def credit_lock(*, renter: AbstractBaseUser) -> Account:
    """The renter's credit account, locked until the caller's transaction ends
    (PostgreSQL: ``SELECT … FOR UPDATE``; SQLite: its one writer), so that
    checks of one renter's credit run one after the other. Made on the renter's
    first request. Must run inside a transaction."""
    locked = Account.objects.select_for_update().filter(
        kind=Account.Kind.RENTER_CREDIT, user=renter
    )
    account = locked.first()
    if account is None:
        account_for(kind=Account.Kind.RENTER_CREDIT, user=renter)
        account = locked.get()
    return account


def credit_available_nano(*, renter: AbstractBaseUser, account: Account) -> int:
    """The renter's balance (the account's running ``balance_nano``) less
    ``credit_reserved_nano``, nano-USD. ``account``: ``credit_lock``'s."""
    return account.balance_nano - credit_reserved_nano(renter=renter)
