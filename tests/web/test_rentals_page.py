"""Renters rent a device from their overview page (DESIGN.md rentals; issue 5)."""

from __future__ import annotations

from django.urls import reverse

from billing.money import usd_to_nano
from billing.services import renter_top_up
from jobs.models import Rental


def test_it_rents_a_device_from_the_overview_and_ends_it(owner_client, owner, machine):
    renter_top_up(user=owner, amount_nano=usd_to_nano(5), key="page-rent")
    device = machine.devices.get()
    page = owner_client.get(reverse("renter:overview")).content.decode()
    assert "<title>Balance and API keys" in page
    assert f'<option value="{device.id}">' in page
    response = owner_client.post(
        reverse("renter:rental_create"), {"device": device.id, "hours": 2}
    )
    assert response.status_code == 302
    rental = Rental.objects.get()
    assert (rental.renter, rental.device, rental.hours, rental.status) == (
        owner,
        device,
        2,
        "pending",
    )
    device.refresh_from_db()
    assert device.spot_check_reason == "rental", "the rental's check is due at once"
    page = owner_client.get(reverse("renter:overview")).content.decode()
    assert "is pending" in page and "no device free to rent" in page
    owner_client.post(reverse("renter:rental_end", args=[rental.id]))
    rental.refresh_from_db()
    assert rental.status == "ended"


def test_it_says_why_a_rental_is_refused(owner_client, machine):
    device = machine.devices.get()
    owner_client.post(
        reverse("renter:rental_create"), {"device": device.id, "hours": 1}
    )
    page = owner_client.get(reverse("renter:overview")).content.decode()
    assert "balance cannot cover" in page  # no credit: 402's message, on the page
    assert not Rental.objects.exists()


def test_a_stranger_cannot_end_someone_elses_rental(
    owner_client, owner, stranger, machine
):
    from django.test import Client

    renter_top_up(user=owner, amount_nano=usd_to_nano(5), key="page-rent-2")
    owner_client.post(
        reverse("renter:rental_create"),
        {"device": machine.devices.get().id, "hours": 1},
    )
    rental = Rental.objects.get()
    other = Client()
    other.force_login(stranger)
    assert other.post(reverse("renter:rental_end", args=[rental.id])).status_code == 404
    rental.refresh_from_db()
    assert rental.status == "pending"
