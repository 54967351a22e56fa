"""The renter's statement, the host's earnings page and payout requests."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.test import Client
from django.urls import reverse

from billing.models import Account, LedgerTransaction, PayoutRequest
from billing.services import holds_release
from catalog.models import CatalogModel
from tests.billing.helpers import balance

pytestmark = pytest.mark.django_db


@pytest.fixture
def paid_host(rig, renter):
    """Host ``a`` earned 1864 nano-USD (7 tokens × 333 × 80 %), now available."""
    host = rig.hosts[next(k for k, h in rig.hosts.items() if h.machine.name == "a")]
    job = rig.job(renter=renter, model="test-13b")
    rig.segment(job, text="abcdefghij", tokens=7, device=host.device)
    rig.finish(job)
    holds_release(now=rig.now + timedelta(hours=24))
    return host.machine.owner


def _client(user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


@pytest.mark.parametrize("name", ["billing:statement", "billing:earnings"])
def test_it_requires_login(client, name):
    response = client.get(reverse(name))
    assert response.status_code == 302
    assert response["Location"].startswith(django_settings.LOGIN_URL)


def test_it_shows_the_renter_balance_usage_and_statement(rig, renter, paid_host):
    response = _client(renter).get("/billing/statement/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "$4.999997669" in body  # 5 USD − 2331 nano-USD
    assert "-$0.000002331" in body
    assert "$5.00" in body  # the balance to the cent, the exact figure its title
    assert "test-13b" in body and "Credit added" in body


def test_it_escapes_what_it_shows(rig, renter):
    CatalogModel.objects.create(
        id="<script>x</script>",
        family="t",
        context_length=1,
        vram_per_request_mb=1,
        price_completion_nano=1,
    )
    rig.models.append("<script>x</script>")
    rig.advance(seconds=1)
    job = rig.job(renter=renter, model="<script>x</script>")
    rig.segment(job, text="abc", tokens=2)
    rig.finish(job)
    body = _client(renter).get("/billing/statement/").content.decode()
    assert "<script>x</script>" not in body
    assert "&lt;script&gt;x&lt;/script&gt;" in body


def test_it_shows_a_host_held_available_and_reversed_with_the_jobs_behind_them(
    rig, renter, paid_host
):
    body = _client(paid_host).get("/billing/earnings/").content.decode()
    assert "$0.000001864" in body
    assert "Reversed" in body and "Held" in body and "Available" in body
    job_id = LedgerTransaction.objects.get(kind=LedgerTransaction.Kind.CHARGE).job_id
    assert str(job_id) in body
    assert "csrfmiddlewaretoken" in body


def test_it_shows_nobody_else_s_earnings(rig, renter, paid_host, stranger):
    body = _client(stranger).get("/billing/earnings/").content.decode()
    assert "$0.000001864" not in body
    assert "No earnings yet." in body


def test_it_lets_a_host_request_up_to_the_available_balance(rig, renter, paid_host):
    client = _client(paid_host)
    client.get("/billing/earnings/")
    token = client.cookies["csrftoken"].value
    response = client.post(
        "/billing/earnings/payouts/",
        {"amount_usd": "0.000001", "csrfmiddlewaretoken": token},
    )
    assert response.status_code == 302
    payout = PayoutRequest.objects.get(host=paid_host)
    assert (payout.amount_nano, payout.status) == (1000, PayoutRequest.Status.REQUESTED)
    response = client.post(
        "/billing/earnings/payouts/",
        {"amount_usd": "0.000000865", "csrfmiddlewaretoken": token},
    )
    assert response.status_code == 400  # 1864 − 1000 requested leaves 864
    assert "0.000000864" in response.content.decode()
    assert PayoutRequest.objects.count() == 1


def test_it_refuses_a_payout_post_without_csrf(rig, renter, paid_host):
    response = _client(paid_host).post(
        "/billing/earnings/payouts/", {"amount_usd": "0.000001"}
    )
    assert response.status_code == 403
    assert not PayoutRequest.objects.exists()


def test_it_lets_staff_approve_reject_and_mark_paid_in_the_admin(
    rig, renter, paid_host, django_user_model
):
    from billing.services import payout_request

    first = payout_request(host=paid_host, amount_nano=1000)
    second = payout_request(host=paid_host, amount_nano=500)
    staff = django_user_model.objects.create_superuser(
        "staff@example.com", "staff@example.com", "pw"
    )
    admin = Client()
    admin.force_login(staff)
    url = reverse("admin:billing_payoutrequest_changelist")
    assert admin.get(url).status_code == 200
    admin.post(url, {"action": "approve", "_selected_action": [first.id]})
    admin.post(url, {"action": "reject", "_selected_action": [second.id]})
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, first.decided_by) == (PayoutRequest.Status.APPROVED, staff)
    assert second.status == PayoutRequest.Status.REJECTED
    assert balance(Account.Kind.HOST_AVAILABLE, paid_host) == 864
    assert balance(Account.Kind.HOST_PAID_OUT, paid_host) == 1000
    payout = LedgerTransaction.objects.get(kind=LedgerTransaction.Kind.PAYOUT)
    assert sorted(e.amount_nano for e in payout.entries.all()) == [-1000, 1000]
    admin.post(
        url, {"action": "approve", "_selected_action": [first.id]}
    )  # twice: refused
    assert (
        LedgerTransaction.objects.filter(kind=LedgerTransaction.Kind.PAYOUT).count()
        == 1
    )
    admin.post(url, {"action": "mark_paid", "_selected_action": [first.id]})
    first.refresh_from_db()
    assert first.status == PayoutRequest.Status.PAID and first.paid_at


def test_it_keeps_the_ledger_read_only_in_the_admin(rig, renter, django_user_model):
    staff = django_user_model.objects.create_superuser(
        "staff@example.com", "staff@example.com", "pw"
    )
    admin = Client()
    admin.force_login(staff)
    txn = LedgerTransaction.objects.first()
    assert (
        admin.get(reverse("admin:billing_ledgertransaction_changelist")).status_code
        == 200
    )
    assert (
        admin.get(
            reverse("admin:billing_ledgertransaction_change", args=[txn.id])
        ).status_code
        == 200
    )
    assert admin.get(reverse("admin:billing_ledgertransaction_add")).status_code == 403
    assert (
        admin.post(
            reverse("admin:billing_ledgertransaction_delete", args=[txn.id])
        ).status_code
        == 403
    )
