"""Payout requests: up to the available balance; approval moves the ledger once."""

from __future__ import annotations

import pytest

from billing.models import Account, PayoutRequest
from billing.selectors import host_balances_nano
from billing.services import (
    PayoutError,
    account_for,
    ledger_post,
    payout_approve,
    payout_mark_paid,
    payout_reject,
    payout_request,
    renter_top_up,
)
from tests.billing.helpers import balance

pytestmark = pytest.mark.django_db


@pytest.fixture
def host_with_1000(owner):
    """A host with 1000 nano-USD available (posted from the platform for the test)."""
    ledger_post(
        kind="hold_release",
        key="test-available",
        legs=[
            (account_for(kind=Account.Kind.PLATFORM), -1000),
            (account_for(kind=Account.Kind.HOST_AVAILABLE, user=owner), 1000),
        ],
    )
    return owner


def test_it_refuses_more_than_the_available_balance(host_with_1000):
    with pytest.raises(PayoutError):
        payout_request(host=host_with_1000, amount_nano=1001)
    with pytest.raises(PayoutError):
        payout_request(host=host_with_1000, amount_nano=0)
    payout_request(host=host_with_1000, amount_nano=600)
    with pytest.raises(PayoutError):  # 600 already waiting
        payout_request(host=host_with_1000, amount_nano=401)
    payout_request(host=host_with_1000, amount_nano=400)
    assert host_balances_nano(user=host_with_1000)["requestable"] == 0


def test_it_refuses_a_payout_to_a_user_with_no_earnings(stranger):
    with pytest.raises(PayoutError):
        payout_request(host=stranger, amount_nano=1)


def test_it_moves_available_to_paid_out_on_approval_only(host_with_1000, stranger):
    payout = payout_request(host=host_with_1000, amount_nano=700)
    assert balance(Account.Kind.HOST_AVAILABLE, host_with_1000) == 1000
    payout_approve(payout_id=payout.id, staff=stranger)
    assert balance(Account.Kind.HOST_AVAILABLE, host_with_1000) == 300
    assert balance(Account.Kind.HOST_PAID_OUT, host_with_1000) == 700
    with pytest.raises(PayoutError):
        payout_approve(payout_id=payout.id, staff=stranger)
    with pytest.raises(PayoutError):
        payout_reject(payout_id=payout.id, staff=stranger)
    assert payout_mark_paid(payout_id=payout.id).status == PayoutRequest.Status.PAID
    with pytest.raises(PayoutError):
        payout_mark_paid(payout_id=payout.id)


def test_it_moves_nothing_on_rejection(host_with_1000, stranger):
    payout = payout_request(host=host_with_1000, amount_nano=700)
    payout_reject(payout_id=payout.id, staff=stranger)
    assert balance(Account.Kind.HOST_AVAILABLE, host_with_1000) == 1000
    assert host_balances_nano(user=host_with_1000)["requestable"] == 1000
    with pytest.raises(PayoutError):
        payout_mark_paid(payout_id=payout.id)


def test_it_refuses_to_approve_what_is_no_longer_available(host_with_1000, stranger):
    first = payout_request(host=host_with_1000, amount_nano=1000)
    second = PayoutRequest.objects.create(
        host=host_with_1000, amount_nano=500
    )  # e.g. by a bug
    payout_approve(payout_id=first.id, staff=stranger)
    with pytest.raises(PayoutError):
        payout_approve(payout_id=second.id, staff=stranger)
    assert balance(Account.Kind.HOST_PAID_OUT, host_with_1000) == 1000


def test_it_refuses_a_non_positive_top_up(renter):
    with pytest.raises(ValueError):
        renter_top_up(user=renter, amount_nano=0, key="zero")
