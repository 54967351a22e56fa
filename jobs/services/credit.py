"""A renter's credit: the balance less what open commitments may still cost
(DESIGN.md "Money": the worst case is held before an offer goes out).

The request path reads it on every request: fixed statements
(``ballast.rows``), one for the locked account and one for the open jobs
(``jobs_open_of``, read once for the credit, the key's open-job limit and its
spending cap).
"""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import DEFAULT_DB_ALIAS, connection

from ballast.db import for_update
from ballast.rows import columns, instances, value
from billing.models import Account
from billing.services import account_for
from catalog.models import CatalogModel

from ..models import Job, Rental

_IN = ", ".join  # (the statuses are code constants, never renters' values)

# what the credit, the key's open-job limit and its cap read of an open job (in
# the model's field order: ``Model.from_db`` defers the others by it)
_OPEN_JOB_FIELDS = ("id", "api_key_id", "model_id", "params", "price_completion_nano")
_OPEN_JOB_COLUMNS = [Job._meta.get_field(name) for name in _OPEN_JOB_FIELDS]
_OPEN_JOBS_SQL = (
    f"SELECT {', '.join(_OPEN_JOB_FIELDS)} FROM jobs_job"
    " WHERE renter_id = %s AND status IN ("
    + _IN(f"'{status}'" for status in Job.OPEN_STATUSES)
    + ")"
)
_ACCOUNT = (Account, "a")
_LOCKED_ACCOUNT_SQL = (
    "SELECT {columns}, EXISTS (SELECT 1 FROM jobs_rental r"
    " WHERE r.renter_id = a.user_id AND r.status IN ("
    + _IN(f"'{status}'" for status in Rental.OPEN_STATUSES)
    + ")) AS rentals_open FROM billing_account a WHERE a.kind = %s AND a.user_id = %s"
)


def jobs_open_of(*, renter: AbstractBaseUser) -> list[Job]:
    """The renter's queued and running jobs, with ``api_key_id``, ``model_id``,
    ``params`` and ``price_completion_nano`` (one statement)."""
    with connection.cursor() as cursor:
        cursor.execute(_OPEN_JOBS_SQL, [renter.pk])
        rows = cursor.fetchall()
    return [
        Job.from_db(
            DEFAULT_DB_ALIAS,
            _OPEN_JOB_FIELDS,
            [value(f, raw) for f, raw in zip(_OPEN_JOB_COLUMNS, row, strict=True)],
        )
        for row in rows
    ]


def credit_reserved_nano(
    *,
    renter: AbstractBaseUser,
    rentals_open: bool = True,
    open_jobs: list[Job] | None = None,
) -> int:
    """What the renter's open commitments may still cost, nano-USD.

    The worst case (``max_tokens`` × the price each was admitted at) of their
    open jobs (``open_jobs``: ``jobs_open_of``'s, read here when not given),
    plus the unbilled hours of their pending and live rentals
    (``rentals_open`` False: the caller knows there are none).
    """
    if open_jobs is None:
        open_jobs = jobs_open_of(renter=renter)
    jobs = jobs_worst_case_nano(open_jobs)
    rentals = 0
    if rentals_open:
        for rental in Rental.objects.filter(
            renter=renter, status__in=Rental.OPEN_STATUSES
        ):
            hours_left = float(rental.hours)
            if rental.billed_until and rental.starts_at:
                billed = (rental.billed_until - rental.starts_at).total_seconds() / 3600
                hours_left = max(0.0, rental.hours - billed)
            rentals += int(hours_left * rental.price_per_hour_nano)
    return jobs + rentals


def jobs_worst_case_nano(open_jobs: list[Job]) -> int:
    """The worst case of these open jobs, nano-USD: each one's ``max_tokens`` ×
    the price it was admitted at (the catalog's for a job stored without one).
    ``open_jobs`` need ``model_id``, ``params`` and ``price_completion_nano``."""
    missing = {job.model_id for job in open_jobs if job.price_completion_nano is None}
    prices = (
        dict(
            CatalogModel.objects.filter(id__in=missing).values_list(
                "id", "price_completion_nano"
            )
        )
        if missing
        else {}
    )
    return sum(
        (job.params.get("max_tokens") or 0)
        * (
            job.price_completion_nano
            if job.price_completion_nano is not None
            else prices.get(job.model_id, 0)
        )
        for job in open_jobs
    )


def credit_lock(*, renter: AbstractBaseUser) -> Account:
    """The renter's credit account, locked until the caller's transaction ends
    (PostgreSQL: ``SELECT … FOR UPDATE``; SQLite: its one writer), so that
    checks of one renter's credit run one after the other; with
    ``rentals_open`` (whether the renter has a pending or live rental). Made on
    the renter's first request. Must run inside a transaction."""
    account = _account_locked(renter)
    if account is None:
        account_for(kind=Account.Kind.RENTER_CREDIT, user=renter)
        account = _account_locked(renter)
    return account


def _account_locked(renter: AbstractBaseUser) -> Account | None:
    """``credit_lock``'s statement: the renter's credit account locked, with
    ``rentals_open``; None when the renter has none yet."""
    sql = _LOCKED_ACCOUNT_SQL.format(columns=columns(_ACCOUNT)) + for_update("a")
    with connection.cursor() as cursor:
        cursor.execute(sql, [Account.Kind.RENTER_CREDIT, renter.pk])
        row = cursor.fetchone()
    if row is None:
        return None
    (account,) = instances(row[:-1], _ACCOUNT)
    account.rentals_open = bool(row[-1])
    return account


def credit_available_nano(
    *,
    renter: AbstractBaseUser,
    account: Account,
    open_jobs: list[Job] | None = None,
) -> int:
    """The renter's balance (the account's running ``balance_nano``) less
    ``credit_reserved_nano``, nano-USD. ``account``: ``credit_lock``'s;
    ``open_jobs``: ``jobs_open_of``'s, read under that lock (read here when
    not given)."""
    rentals_open = bool(getattr(account, "rentals_open", True))
    return account.balance_nano - credit_reserved_nano(
        renter=renter, rentals_open=rentals_open, open_jobs=open_jobs
    )
