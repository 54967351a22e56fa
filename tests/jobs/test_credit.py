"""The credit check of a request agrees with the ledger and the reservations."""

from __future__ import annotations

import pytest
from django.db import transaction

from billing.services import renter_balance_nano
from catalog.models import CatalogModel
from jobs.models import Job, Rental
from jobs.services import (
    credit_available_nano,
    credit_lock,
    credit_reserved_nano,
    job_create,
)
from tests.conftest import REFERENCE_MODEL

pytestmark = pytest.mark.django_db(transaction=True)


def _job(renter, model, *, max_tokens=None, status=Job.Status.QUEUED) -> Job:
    params = {} if max_tokens is None else {"max_tokens": max_tokens}
    job = job_create(
        renter=renter,
        api_key=None,
        model=model,
        endpoint=Job.Endpoint.CHAT,
        messages=[{"role": "user", "content": "hi"}],
        prompt=None,
        params=params,
        placement={},
        stream=True,
    )
    Job.objects.filter(id=job.id).update(status=status)
    return job


def _available(renter) -> int:
    with transaction.atomic():  # the lock is a row lock: inside a transaction
        account = credit_lock(renter=renter)
        return credit_available_nano(renter=renter, account=account)


def _expected(renter) -> int:
    return renter_balance_nano(user=renter) - credit_reserved_nano(renter=renter)


def test_it_is_the_balance_less_the_worst_case_of_open_jobs(catalog, renter, stranger):
    dear = CatalogModel.objects.create(
        **{**REFERENCE_MODEL, "id": "dear-model", "price_completion_nano": 7_000}
    )
    _job(renter, catalog, max_tokens=100)
    _job(renter, dear, max_tokens=30, status=Job.Status.RUNNING)
    _job(renter, dear)  # no max_tokens: reserves nothing
    _job(renter, catalog, max_tokens=500, status=Job.Status.SUCCEEDED)  # closed
    _job(stranger, dear, max_tokens=900)  # someone else's
    got = _available(renter)
    assert got == _expected(renter)
    assert got == renter_balance_nano(user=renter) - (
        100 * catalog.price_completion_nano + 30 * 7_000
    )


def test_open_rentals_count_too(catalog, renter, live_device):
    _job(renter, catalog, max_tokens=64)
    Rental.objects.create(
        renter=renter,
        device=live_device(),
        hours=3,
        price_per_hour_nano=250_000_000,
        status=Rental.Status.PENDING,
    )
    got = _available(renter)
    assert got == _expected(renter)
    assert got < renter_balance_nano(user=renter) - 64 * catalog.price_completion_nano


def test_the_running_balance_is_the_sum_of_the_entries_whatever_posts_them(
    catalog, renter, stranger
):
    """``Account.balance_nano`` (kept by the database) equals the entries' sum for
    renter accounts after top-ups, charges and direct postings, also when an existing
    account is saved again; other kinds of account keep 0."""
    from billing.models import Account
    from billing.money import usd_to_nano
    from billing.services import account_for, ledger_post, renter_top_up

    start = renter_balance_nano(user=renter)
    renter_top_up(user=renter, amount_nano=usd_to_nano("3.5"), key="t1")
    renter_top_up(user=stranger, amount_nano=usd_to_nano("1"), key="t2")
    credit = account_for(kind=Account.Kind.RENTER_CREDIT, user=renter)
    platform = account_for(kind=Account.Kind.PLATFORM)
    ledger_post(kind="charge", key="c1", legs=[(credit, -123_456), (platform, 123_456)])
    credit.save()  # a stale instance must not overwrite the running total
    for account in Account.objects.all():
        if account.kind == Account.Kind.RENTER_CREDIT:
            assert account.balance_nano == renter_balance_nano(user=account.user)
        else:
            assert account.balance_nano == 0
    assert (
        Account.objects.get(id=credit.id).balance_nano
        == start + usd_to_nano("3.5") - 123_456
    )
    assert _available(renter) == _expected(renter)


def test_the_open_jobs_index_covers_exactly_the_open_statuses():
    """The partial index the credit check reads is of the statuses it sums."""
    index = next(i for i in Job._meta.indexes if i.name == "job_open_by_renter")
    ((lookup, statuses),) = index.condition.children
    assert lookup == "status__in"
    assert sorted(statuses) == sorted(Job.OPEN_STATUSES)
