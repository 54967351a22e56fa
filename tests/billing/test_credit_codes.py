"""Credit codes: made by staff (in the admin), redeemed by renters once each,
up to their number of uses, until they expire; two redemptions at once credit
once where the code allows once (on PostgreSQL, from two connections)."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import close_old_connections, connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing.models import CreditCode, CreditCodeRedemption, LedgerTransaction
from billing.selectors import renter_balance_nano, transactions_unbalanced
from billing.services import (
    CreditCodeError,
    credit_code_create,
    credit_code_new_text,
    credit_code_redeem,
)
from hosts.services import user_get_or_create

pytestmark = pytest.mark.django_db

USD = 10**9


def _renter(name: str):
    return user_get_or_create(email=f"{name}@example.com")


def test_it_redeems_a_single_use_code_once():
    code = credit_code_create(amount_nano=5 * USD, code="welcome-five")
    alice, bob = _renter("alice"), _renter("bob")
    txn = credit_code_redeem(user=alice, code=" Welcome-Five ")
    assert txn.key == f"credit:code:{code.id}:{alice.id}"
    assert txn.memo == "credit code WELCOME-FIVE"
    assert renter_balance_nano(user=alice) == 5 * USD
    with pytest.raises(CreditCodeError, match="already redeemed"):
        credit_code_redeem(user=alice, code="WELCOME-FIVE")
    with pytest.raises(CreditCodeError, match="used up"):
        credit_code_redeem(user=bob, code="WELCOME-FIVE")
    assert renter_balance_nano(user=bob) == 0
    assert CreditCode.objects.get(id=code.id).redeemed_count == 1
    assert transactions_unbalanced() == []


def test_it_lets_an_n_use_code_credit_n_renters():
    credit_code_create(amount_nano=USD, max_redemptions=2, code="TWO-USES")
    for name in ("a", "b"):
        credit_code_redeem(user=_renter(name), code="two-uses")
    with pytest.raises(CreditCodeError, match="used up"):
        credit_code_redeem(user=_renter("c"), code="two-uses")
    assert CreditCodeRedemption.objects.count() == 2


def test_it_refuses_expired_unknown_and_switched_off_codes():
    now = timezone.now()
    credit_code_create(amount_nano=USD, code="OLD-CODE", expires_at=now)
    off = credit_code_create(amount_nano=USD, code="OFF-CODE")
    CreditCode.objects.filter(id=off.id).update(active=False)
    renter = _renter("r")
    with pytest.raises(CreditCodeError, match="expired on"):
        credit_code_redeem(user=renter, code="old-code", now=now)
    for text in ("OFF-CODE", "NOPE-NOPE", ""):
        with pytest.raises(CreditCodeError, match="no such credit code"):
            credit_code_redeem(user=renter, code=text)
    assert not LedgerTransaction.objects.filter(kind="top_up").exists()


def test_random_codes_are_long_and_unambiguous():
    text = credit_code_new_text()
    assert len(text) == 19 and text.count("-") == 3
    assert not set(text) & set("01OIL")
    with pytest.raises(CreditCodeError):
        credit_code_create(amount_nano=0)
    with pytest.raises(CreditCodeError):
        credit_code_create(amount_nano=1, code="a b!")


def test_staff_make_a_code_in_the_admin():
    staff = get_user_model().objects.create_superuser(
        username="staff@example.com", email="staff@example.com", password="x"
    )
    client = Client()
    client.force_login(staff)
    response = client.post(
        reverse("admin:billing_creditcode_add"),
        {
            "code": "",
            "amount_usd": "2.5",
            "max_redemptions": "3",
            "memo": "launch week",
            "redemptions-TOTAL_FORMS": "0",
            "redemptions-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    code = CreditCode.objects.get()
    assert code.amount_nano == 2_500_000_000 and code.max_redemptions == 3
    assert code.created_by == staff and code.memo == "launch week"
    assert len(code.code) == 19
    page = client.get(reverse("admin:billing_creditcode_changelist")).content.decode()
    assert code.code in page and "$2.50" in page


def test_a_renter_redeems_a_code_on_their_page(client):
    credit_code_create(amount_nano=5 * USD, code="HELLO-2026")
    renter = _renter("page")
    client.force_login(renter)
    url = reverse("renter:code_redeem")
    response = client.post(url, {"code": "hello-2026"}, follow=True)
    assert "$5.00 added to your credit." in response.content.decode()
    again = client.post(url, {"code": "hello-2026"})
    assert again.status_code == 400
    assert "You have already redeemed this code." in again.content.decode()
    assert renter_balance_nano(user=renter) == 5 * USD


def test_guessing_codes_is_rate_limited(client, settings):
    from ballast.ratelimits import limits_reset

    settings.BALLAST_CODE_REDEEM_RATE = "3/hour"
    limits_reset()
    client.force_login(_renter("guesser"))
    url = reverse("renter:code_redeem")
    statuses = [client.post(url, {"code": f"GUESS-{i}"}).status_code for i in range(4)]
    assert statuses == [400, 400, 400, 429]
    limits_reset()


def _at_once(target, users: list) -> tuple[list, list[BaseException]]:
    """``target(user)`` in one thread (its own connection) per user, released
    together; their results and exceptions."""
    barrier = threading.Barrier(len(users))
    results: list = []
    errors: list[BaseException] = []

    def run(user):
        try:
            barrier.wait()
            results.append(target(user))
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=run, args=(u,)) for u in users]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "same_renter", [False, True], ids=["two-renters", "one-renter"]
)
def test_two_redemptions_at_once_credit_once(same_renter):
    """A single-use code redeemed from two connections at the same moment (by
    two renters, or by one renter twice): one credit, one refusal."""
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite has a single writer")
    code = credit_code_create(amount_nano=5 * USD, code="RACE-ONCE")
    first = _renter("first")
    users = [first, first] if same_renter else [first, _renter("second")]
    results, errors = _at_once(
        lambda user: credit_code_redeem(user=user, code="RACE-ONCE"), users
    )
    assert len(results) == 1 and len(errors) == 1
    assert isinstance(errors[0], CreditCodeError)
    credited = sum(renter_balance_nano(user=u) for u in set(users))
    assert credited == 5 * USD
    assert CreditCode.objects.get(id=code.id).redeemed_count == 1
    assert CreditCodeRedemption.objects.count() == 1
    assert transactions_unbalanced() == []
