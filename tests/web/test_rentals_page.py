"""Renters rent a device from their overview page (DESIGN.md rentals; issue 5),
never their own (issue 24)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from billing.money import usd_to_nano
from billing.services import renter_top_up
from jobs.models import Rental


@pytest.fixture
def renter_client(renter):
    """A renter with credit, logged in (someone other than the machine's owner)."""
    client = Client()
    client.force_login(renter)
    return client


def test_it_rents_a_device_from_the_overview_and_ends_it(
    renter_client, renter, machine
):
    device = machine.devices.get()
    page = renter_client.get(reverse("renter:overview")).content.decode()
    assert "<title>Balance and API keys" in page
    assert f'<option value="{device.id}">' in page
    response = renter_client.post(
        reverse("renter:rental_create"), {"device": device.id, "hours": 2}
    )
    assert response.status_code == 302
    rental = Rental.objects.get()
    assert (rental.renter, rental.device, rental.hours, rental.status) == (
        renter,
        device,
        2,
        "pending",
    )
    device.refresh_from_db()
    assert device.spot_check_reason == "rental", "the rental's check is due at once"
    page = renter_client.get(reverse("renter:overview")).content.decode()
    assert "is pending" in page and "no device free to rent" in page
    renter_client.post(reverse("renter:rental_end", args=[rental.id]))
    rental.refresh_from_db()
    assert rental.status == "ended"


def test_it_says_why_a_rental_is_refused(stranger_client, machine):
    device = machine.devices.get()
    stranger_client.post(
        reverse("renter:rental_create"), {"device": device.id, "hours": 1}
    )
    page = stranger_client.get(reverse("renter:overview")).content.decode()
    assert "balance cannot cover" in page  # no credit: 402's message, on the page
    assert not Rental.objects.exists()


def test_it_neither_offers_nor_rents_the_renters_own_device(
    owner_client, owner, machine
):
    """A host renting its own device would pay itself (issue 24): not listed,
    and refused with a clear message when posted anyway."""
    renter_top_up(user=owner, amount_nano=usd_to_nano(5), key="page-rent-own")
    device = machine.devices.get()
    page = owner_client.get(reverse("renter:overview")).content.decode()
    assert f'<option value="{device.id}">' not in page
    assert "no device free to rent" in page
    owner_client.post(
        reverse("renter:rental_create"), {"device": device.id, "hours": 1}
    )
    page = owner_client.get(reverse("renter:overview")).content.decode()
    assert "you cannot rent your own device" in page
    assert not Rental.objects.exists()


def test_a_stranger_cannot_end_someone_elses_rental(
    renter_client, stranger_client, machine
):
    renter_client.post(
        reverse("renter:rental_create"),
        {"device": machine.devices.get().id, "hours": 1},
    )
    rental = Rental.objects.get()
    response = stranger_client.post(reverse("renter:rental_end", args=[rental.id]))
    assert response.status_code == 404
    rental.refresh_from_db()
    assert rental.status == "pending"
