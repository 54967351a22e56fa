"""Renter pages: balance, API keys (created with a name and shown once, revoked),
the job log with attempts and failed_over; another renter's things are 404."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from jobs.models import ApiKey
from jobs.services import api_key_authenticate

from .conftest import attempt_make


@pytest.fixture
def renter_client(client, renter):
    client.force_login(renter)
    return client


def test_it_shows_the_balance_and_a_statement_link(renter_client):
    html = renter_client.get(reverse("renter:overview")).content.decode()
    assert (
        '<div class="figure" id="balance"><span class="usd">$5.00</span></div>' in html
    )
    assert 'href="/billing/statement/"' in html


def test_it_creates_a_named_key_shown_once(renter_client, renter):
    response = renter_client.post(reverse("renter:key_create"), {"name": "my script"})
    assert response.status_code == 302
    html = renter_client.get(reverse("renter:overview")).content.decode()
    plain = re.search(r"(bk_[A-Za-z0-9_\-]+)", html).group(1)
    key = api_key_authenticate(plain=plain)
    assert key.user == renter and key.name == "my script"
    assert plain not in renter_client.get(reverse("renter:overview")).content.decode()


def test_it_revokes_a_key(renter_client, renter):
    renter_client.post(reverse("renter:key_create"), {"name": "old"})
    key = ApiKey.objects.get(user=renter, name="old")
    renter_client.post(reverse("renter:key_revoke", args=[key.id]))
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_it_gives_404_for_another_renters_key(stranger_client, renter):
    key, _ = ApiKey.objects.get_or_create(
        user=renter, name="x", prefix="bk_x", key_hash="h" * 64
    )
    assert (
        stranger_client.post(reverse("renter:key_revoke", args=[key.id])).status_code
        == 404
    )
    key.refresh_from_db()
    assert key.revoked_at is None


def test_it_lists_jobs_with_attempts_and_failed_over(renter_client, renter, machine):
    device = machine.devices.get()
    attempt = attempt_make(device, renter=renter, failed_over=True)
    html = renter_client.get(reverse("renter:jobs")).content.decode()
    assert "failed over" in html and "fresh: succeeded" in html
    detail = renter_client.get(
        reverse("renter:job", args=[attempt.job_id])
    ).content.decode()
    assert "rig-1/gpu0" in detail and "180 ms" in detail


def test_it_gives_404_for_another_renters_job(stranger_client, renter, machine):
    attempt = attempt_make(machine.devices.get(), renter=renter)
    assert (
        stranger_client.get(reverse("renter:job", args=[attempt.job_id])).status_code
        == 404
    )
    assert (
        str(attempt.job_id)
        not in stranger_client.get(reverse("renter:jobs")).content.decode()
    )


def test_it_lists_the_renters_rentals_only(renter_client, renter, stranger, machine):
    from jobs.models import Rental

    device = machine.devices.get()
    mine = Rental.objects.create(
        renter=renter, device=device, hours=2, price_per_hour_nano=10**9
    )
    theirs = Rental.objects.create(
        renter=stranger, device=device, hours=1, price_per_hour_nano=10**9
    )
    html = renter_client.get(reverse("renter:overview")).content.decode()
    assert str(mine.id) in html and "rig-1/gpu0" in html and "$1" in html
    assert str(theirs.id) not in html
