"""Renting one's own device is refused (issue 24 item 5): a host renting its own
device would pay itself 80 % back of a price nobody else paid. The one function
that starts a rental (``jobs.rentals.rental_create``) refuses it, so the API and
the page both do; ``/v1/devices`` does not offer it."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from billing.money import usd_to_nano
from billing.services import renter_top_up
from jobs.errors import ApiError
from jobs.models import Rental
from jobs.rentals import rental_create
from jobs.services import api_key_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner_key(owner):
    """The host's own API key, with credit: the host is a renter too."""
    renter_top_up(user=owner, amount_nano=usd_to_nano(5), key="own-device")
    _, plain = api_key_create(user=owner)
    return plain


def _api(key: str) -> Client:
    return Client(headers={"authorization": f"Bearer {key}"})


def test_the_one_function_that_starts_a_rental_refuses_the_renters_own_device(
    owner, live_device
):
    device = live_device("rig")
    renter_top_up(user=owner, amount_nano=usd_to_nano(5), key="own-direct")
    with pytest.raises(ApiError) as refused:
        rental_create(renter=owner, device_id=device.id, hours=1)
    assert refused.value.status == 403 and refused.value.code == "own_device"
    assert "you cannot rent your own device" in refused.value.message
    assert not Rental.objects.exists()


def test_the_api_refuses_it_and_does_not_list_it(owner_key, api_key, live_device):
    device = live_device("rig")
    response = _api(owner_key).post(
        "/v1/rentals",
        {"device": device.id, "hours": 1},
        content_type="application/json",
    )
    assert response.status_code == 403
    error = json.loads(response.content)["error"]
    assert error["code"] == "own_device" and error["type"] == "permission_error"
    assert error["param"] == "device"
    own = json.loads(_api(owner_key).get("/v1/devices").content)["data"]
    assert own == []
    others = json.loads(_api(api_key).get("/v1/devices").content)["data"]
    assert [d["id"] for d in others] == [device.id], "another renter may rent it"
    response = _api(api_key).post(
        "/v1/rentals",
        {"device": device.id, "hours": 1},
        content_type="application/json",
    )
    assert response.status_code == 201
