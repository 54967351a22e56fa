"""The request path's one-read credit check agrees with the ledger and the reservations."""

from __future__ import annotations

import pytest
from django.db import transaction

from billing.services import renter_balance_nano
from jobs.models import CatalogModel, Job, Rental
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
        account_id = credit_lock(renter=renter)
        return credit_available_nano(renter=renter, account_id=account_id)


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
