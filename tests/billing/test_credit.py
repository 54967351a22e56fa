"""Credit without the operator: ``credit_add`` (the one way credit comes in,
idempotent per source and reference: the seam a payment provider's webhook
calls), refunds bounded by what was charged, and staff's top-up/refund page in
the admin recording who and why."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from billing.models import Account, LedgerTransaction
from billing.selectors import renter_balance_nano, transactions_unbalanced
from billing.services import (
    CreditError,
    CreditSource,
    account_for,
    credit_add,
    credit_refund,
    credit_refundable_nano,
)
from hosts.services import user_get_or_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(db):
    return get_user_model().objects.create_superuser(
        username="staff@example.com", email="staff@example.com", password="x"
    )


@pytest.fixture
def staff_client(staff):
    client = Client(enforce_csrf_checks=False)
    client.force_login(staff)
    return client


@pytest.fixture
def charged_job(rig, renter):
    """A job of ``renter`` charged 7 tokens × 333 = 2331 nano-USD."""
    job = rig.job(renter=renter, model="test-13b")
    rig.segment(job, text="abcdefghij", tokens=7)
    return rig.finish(job)


def test_it_credits_once_per_source_and_reference(renter):
    """A provider's webhook delivered twice (same payment id) credits once."""
    first = credit_add(
        user=renter,
        amount_nano=2_500_000_000,
        source="stripe",
        reference="pi_3NxYz",
        memo="card payment",
    )
    again = credit_add(
        user=renter, amount_nano=2_500_000_000, source="stripe", reference="pi_3NxYz"
    )
    assert first is not None and again is None
    assert first.key == "credit:stripe:pi_3NxYz"
    assert first.kind == LedgerTransaction.Kind.TOP_UP and first.memo == "card payment"
    assert renter_balance_nano(user=renter) == 7_500_000_000  # 5 USD + 2.50
    assert transactions_unbalanced() == []


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"amount_nano": 0}, "more than $0.00"),
        ({"amount_nano": -5}, "more than $0.00"),
        ({"amount_nano": 10**16}, "at most $1,000,000.00"),
        ({"source": "Bad Source"}, "lower-case name"),
        ({"reference": "has space"}, "printable"),
        ({"reference": ""}, "printable"),
    ],
)
def test_it_refuses_a_bad_top_up(renter, kwargs, words):
    args = {"amount_nano": 1, "source": "staff", "reference": "r1", **kwargs}
    with pytest.raises(CreditError, match=re.escape(words)):
        credit_add(user=renter, **args)
    assert not LedgerTransaction.objects.filter(key__startswith="credit:staff").exists()


def test_it_refunds_a_job_up_to_its_charge(renter, staff, charged_job):
    assert credit_refundable_nano(user=renter, job_id=charged_job.id) == 2331
    before = renter_balance_nano(user=renter)
    txn = credit_refund(
        user=renter,
        amount_nano=2000,
        reason="the answer was cut",
        actor=staff,
        reference="t1",
        job_id=charged_job.id,
    )
    assert txn.kind == LedgerTransaction.Kind.REFUND and txn.actor == staff
    assert txn.job_id == charged_job.id and txn.memo == "the answer was cut"
    legs = dict(txn.entries.values_list("account__kind", "amount_nano"))
    assert legs == {Account.Kind.PLATFORM: -2000, Account.Kind.RENTER_CREDIT: 2000}
    assert renter_balance_nano(user=renter) == before + 2000
    with pytest.raises(CreditError, match=r"at most \$0.000000331"):
        credit_refund(
            user=renter,
            amount_nano=332,
            reason="more",
            actor=staff,
            reference="t2",
            job_id=charged_job.id,
        )
    # the same form sent again posts nothing more
    assert (
        credit_refund(
            user=renter,
            amount_nano=2000,
            reason="the answer was cut",
            actor=staff,
            reference="t1",
            job_id=charged_job.id,
        )
        is None
    )
    assert transactions_unbalanced() == []


def test_it_refunds_no_more_than_was_ever_charged(renter, staff, charged_job):
    with pytest.raises(CreditError, match="at most"):
        credit_refund(
            user=renter, amount_nano=2332, reason="x", actor=staff, reference="r"
        )
    with pytest.raises(CreditError, match="say why"):
        credit_refund(
            user=renter, amount_nano=1, reason=" ", actor=staff, reference="r"
        )
    stranger = user_get_or_create(email="s@example.com")
    with pytest.raises(CreditError, match="at most"):  # not their job
        credit_refund(
            user=stranger,
            amount_nano=1,
            reason="x",
            actor=staff,
            reference="r",
            job_id=charged_job.id,
        )


def test_staff_top_up_a_new_renter_in_the_admin(staff_client, staff):
    """Staff find a renter by email (no credit account yet), add credit with a
    reason; the ledger records who and why; the same form sent twice posts once."""
    newcomer = user_get_or_create(email="new@example.com")
    add = reverse("admin:billing_rentercredit_add")
    page = staff_client.post(add, {"email": "NEW@example.com"})
    account = account_for(kind=Account.Kind.RENTER_CREDIT, user=newcomer)
    change = reverse("admin:billing_rentercredit_change", args=[account.id])
    assert page.status_code == 302 and page["Location"] == change
    form = staff_client.get(change).content.decode()
    token = re.search(r'name="token" value="([0-9a-f]+)"', form).group(1)
    post = {
        "action": "top_up",
        "amount_usd": "12.50",
        "reason": "bank transfer of 1 Dec",
        "token": token,
    }
    assert staff_client.post(change, post).status_code == 302
    assert staff_client.post(change, post).status_code == 302  # a double click
    txn = LedgerTransaction.objects.get(key=f"credit:staff:{token}")
    assert txn.actor == staff and txn.memo == "bank transfer of 1 Dec"
    assert renter_balance_nano(user=newcomer) == 12_500_000_000
    page = staff_client.get(change).content.decode()
    assert "$12.50" in page and "bank transfer of 1 Dec" in page
    assert "staff@example.com" in page
    assert transactions_unbalanced() == []


def test_staff_refund_a_job_in_the_admin(staff_client, renter, charged_job):
    account = account_for(kind=Account.Kind.RENTER_CREDIT, user=renter)
    change = reverse("admin:billing_rentercredit_change", args=[account.id])
    post = {
        "action": "refund",
        "amount_usd": "0.000002331",
        "reason": "garbled answer",
        "job": str(charged_job.id),
        "token": "f" * 32,
    }
    assert staff_client.post(change, post).status_code == 302
    refund = LedgerTransaction.objects.get(kind=LedgerTransaction.Kind.REFUND)
    assert refund.job_id == charged_job.id
    over = staff_client.post(change, {**post, "token": "e" * 32})
    assert over.status_code == 200
    assert "at most $0.00" in over.content.decode()
    assert LedgerTransaction.objects.filter(kind="refund").count() == 1
    statement = Client()
    statement.force_login(renter)
    body = statement.get(reverse("billing:statement")).content.decode()
    assert "Refund: garbled answer" in body


def test_a_renter_cannot_reach_the_credit_admin(renter):
    client = Client()
    client.force_login(renter)
    account = account_for(kind=Account.Kind.RENTER_CREDIT, user=renter)
    change = reverse("admin:billing_rentercredit_change", args=[account.id])
    response = client.post(
        change, {"action": "top_up", "amount_usd": "99", "reason": "x", "token": "a"}
    )
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert renter_balance_nano(user=renter) == 5 * 10**9


def test_the_operator_command_credits_through_credit_add(db):
    from io import StringIO

    from django.core.management import call_command

    call_command("renter_create", "op@example.com", "--credit", "3", stdout=StringIO())
    txn = LedgerTransaction.objects.get(kind=LedgerTransaction.Kind.TOP_UP)
    assert txn.key.startswith(f"credit:{CreditSource.OPERATOR}:")
