"""The low-balance email: one email when a renter's credit falls below the
threshold (not one per job), none again until a credit brings it back above,
the renter's own threshold (0: never), through Django's locmem outbox."""

from __future__ import annotations

import pytest
from django.core import mail
from django.urls import reverse
from django.utils.crypto import get_random_string

from billing.models import Account
from billing.services import (
    account_for,
    balance_low_emails_send,
    balance_low_threshold_set,
    credit_add,
    ledger_post,
)
from hosts.services import user_get_or_create

pytestmark = pytest.mark.django_db

USD = 10**9


@pytest.fixture
def low_renter(settings):
    """A renter with $1.50; emailed under $1.00 (the default threshold)."""
    settings.BALLAST_LOW_BALANCE_USD = "1.00"
    user = user_get_or_create(email="low@example.com")
    credit_add(
        user=user, amount_nano=1_500_000_000, source="operator", reference="start"
    )
    return user


def _spend(user, nano: int) -> None:
    """A charge of ``nano`` from the renter's credit to the platform."""
    ledger_post(
        kind="charge",
        key=f"spend:{get_random_string(10)}",
        legs=[
            (account_for(kind=Account.Kind.RENTER_CREDIT, user=user), -nano),
            (account_for(kind=Account.Kind.PLATFORM), nano),
        ],
    )


def _account(user) -> Account:
    return Account.objects.get(kind=Account.Kind.RENTER_CREDIT, user=user)


def test_it_emails_once_when_the_balance_falls_below(low_renter):
    _spend(low_renter, 400_000_000)  # $1.10: still above
    assert balance_low_emails_send() == 0
    _spend(low_renter, 200_000_000)  # $0.90: below
    _spend(low_renter, 100_000_000)  # $0.80: a second job, still below
    assert balance_low_emails_send() == 1
    _spend(low_renter, 100_000_000)
    assert balance_low_emails_send() == 0  # remembered: no email per job
    assert len(mail.outbox) == 1
    email = mail.outbox[0]
    assert email.to == ["low@example.com"]
    assert email.subject == "Your Ballast credit is low: $0.80"
    assert "below the $1.00 you are warned at" in email.body
    assert "redeem a credit code" in email.body


def test_a_top_up_above_the_threshold_arms_it_again(low_renter):
    _spend(low_renter, 600_000_000)  # $0.90
    assert balance_low_emails_send() == 1
    credit_add(user=low_renter, amount_nano=50_000_000, source="staff", reference="a")
    assert _account(low_renter).low_balance_at is not None  # $0.95: still low
    credit_add(user=low_renter, amount_nano=USD, source="staff", reference="b")
    assert _account(low_renter).low_balance_at is None  # $1.95: armed again
    _spend(low_renter, USD)  # $0.95
    assert balance_low_emails_send() == 1
    assert len(mail.outbox) == 2


def test_the_renters_own_threshold_and_zero_for_never(low_renter, client):
    client.force_login(low_renter)
    client.post(reverse("renter:low_balance_set"), {"threshold_usd": "2"})
    assert _account(low_renter).low_balance_nano == 2 * USD
    assert balance_low_emails_send() == 1  # $1.50 is under the new $2.00 at once
    balance_low_threshold_set(user=low_renter, threshold_nano=0)
    _spend(low_renter, 1_400_000_000)
    assert balance_low_emails_send() == 0
    assert len(mail.outbox) == 1
    client.post(reverse("renter:low_balance_set"), {"threshold_usd": ""})
    assert _account(low_renter).low_balance_nano is None  # back to the default
    assert balance_low_emails_send() == 1  # $0.10 < $1.00


def test_a_real_job_charge_crosses_it(rig, renter, settings, model13b):
    """The charge of a job's end (the one charge path) marks the fall."""
    settings.BALLAST_LOW_BALANCE_USD = "4.9999990"
    job = rig.job(renter=renter, model="test-13b")
    rig.segment(job, text="abcdefghij", tokens=7)  # 2331 nano-USD
    rig.finish(job)
    assert _account(renter).low_balance_at is not None
    assert balance_low_emails_send() == 1
    assert mail.outbox[0].to == ["renter@example.com"]
