"""Rentals (DESIGN.md "Vocabulary", "Spot checks"): live only after a passed check,
only its renter's jobs meanwhile, stopped by a failed check and billed only up to
the last pass."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.db.models import F
from django.test import AsyncClient
from django.utils import timezone

from billing.models import Earning, LedgerTransaction
from billing.services import renter_balance_nano
from hosts.models import Device
from hosts.services import spot_check_mark_due
from jobs.models import Rental
from jobs.rentals import rental_price_per_hour_nano, rentals_settle
from tests.devices import machine_online_since

from .helpers import chat_request, host_online, right_answer
from .helpers import verdict as _verdict

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def _api(method: str, path: str, api_key: str, body=None):
    client = AsyncClient()
    call = getattr(client, method)
    kwargs = {"headers": {"authorization": f"Bearer {api_key}"}}
    if body is not None:
        kwargs.update(data=body, content_type="application/json")
    return await call(path, **kwargs)


async def _passing_host(machine_token, name):
    host = await host_online(machine_token, name)
    offer = await host.recv_type("offer")  # first-load spot check
    await host.answer(offer, [await right_answer(offer)])
    await _verdict(offer["job"])
    host.device = await Device.objects.aget(machine=host.machine)
    return host


async def _rent(host, api_key, hours=2):
    response = await _api(
        "post", "/v1/rentals", api_key, {"device": host.device.id, "hours": hours}
    )
    assert response.status_code == 201, response.content
    rental = json.loads(response.content)
    assert rental["status"] == "pending"
    await host.heartbeat()
    offer = await host.recv_type("offer")
    await host.answer(offer, [await right_answer(offer)])
    check = await _verdict(offer["job"])
    assert check.reason == "rental"
    return await Rental.objects.aget(id=rental["id"])


async def _live_since(rental: Rental, host, ago: timedelta) -> Rental:
    """Move a live rental's start (and its billing, checks and end with it)
    ``ago`` into the past, its device online since then: billing counts only
    the time the device was live (``jobs.rentaltime``)."""
    shift = {
        name: F(name) - ago
        for name in ("starts_at", "ends_at", "last_pass_at", "last_check_at")
    }
    await Rental.objects.filter(id=rental.id).aupdate(
        **shift, billed_until=F("starts_at") - ago
    )
    await rental.arefresh_from_db()
    await database_sync_to_async(machine_online_since)(host.machine, rental.starts_at)
    return rental


async def test_a_rental_goes_live_after_a_passed_check_and_takes_only_its_renters_jobs(
    canaries, api_key, machine_token
):
    rented = await _passing_host(machine_token, "rented")
    other = await _passing_host(machine_token, "other")
    listed = json.loads((await _api("get", "/v1/devices", api_key)).content)["data"]
    assert {d["label"] for d in listed} == {"rented/gpu0", "other/gpu0"}
    rental = await _rent(rented, api_key)
    assert rental.status == "live" and rental.ends_at - rental.starts_at == timedelta(
        hours=2
    )
    listed = json.loads((await _api("get", "/v1/devices", api_key)).content)["data"]
    assert [d["label"] for d in listed] == ["other/gpu0"], (
        "a rented device is not offered to others"
    )
    for _ in range(2):  # serverless work never goes to the rented device
        request = chat_request(api_key, stream=False)
        offer = await other.recv_type("offer")
        await other.answer(offer, ["ok"])
        assert (await request).status_code == 200
    assert await rented.ws.receive_nothing(timeout=0.2)
    request = chat_request(api_key, stream=False, placement={"rental": str(rental.id)})
    offer = await rented.recv_type("offer")
    await rented.answer(offer, ["mine"])
    response = await request
    assert json.loads(response.content)["choices"][0]["message"]["content"] == "mine"
    await rented.close()
    await other.close()


async def test_a_failed_check_stops_the_rental_billed_up_to_the_last_pass(
    canaries, api_key, renter, machine_token
):
    host = await _passing_host(machine_token, "rig")
    rental = await _live_since(
        await _rent(host, api_key, hours=5), host, timedelta(hours=2)
    )
    balance = await database_sync_to_async(renter_balance_nano)(user=renter)
    # a check passed 1 h after the start, and the next one fails now
    passed_at = rental.starts_at + timedelta(hours=1)
    await Rental.objects.filter(id=rental.id).aupdate(last_pass_at=passed_at)
    await database_sync_to_async(spot_check_mark_due)(
        device_id=host.device.id, reason="rental"
    )
    await host.heartbeat()
    offer = await host.recv_type("offer")
    await host.answer(offer, ["Wrong answer."])
    await _verdict(offer["job"])
    await rental.arefresh_from_db()
    assert rental.status == "stopped" and rental.billed_until == passed_at
    price = rental_price_per_hour_nano()
    after = await database_sync_to_async(renter_balance_nano)(user=renter)
    assert balance - after == price, "exactly the hour up to the last pass"
    txn = await LedgerTransaction.objects.aget(kind="rental")
    assert txn.key.startswith(f"rental:{rental.id}:")
    response = await _api(
        "post",
        "/v1/chat/completions",
        api_key,
        {
            "model": "smollm2-135m-instruct",
            "messages": [{"role": "user", "content": "x"}],
            "placement": {"rental": str(rental.id)},
        },
    )
    assert response.status_code == 409
    await host.close()


async def test_a_rental_ends_and_is_billed_for_its_hours(
    canaries, api_key, renter, machine_token
):
    host = await _passing_host(machine_token, "rig")
    rental = await _live_since(
        await _rent(host, api_key, hours=3), host, timedelta(hours=3, minutes=1)
    )
    balance = await database_sync_to_async(renter_balance_nano)(user=renter)
    assert (
        await database_sync_to_async(rentals_settle)(
            now=rental.ends_at - timedelta(seconds=1)
        )
        == 0
    )
    assert await database_sync_to_async(rentals_settle)(now=timezone.now()) == 1
    await rental.arefresh_from_db()
    assert rental.status == "ended"
    charged = balance - await database_sync_to_async(renter_balance_nano)(user=renter)
    assert charged == 3 * rental_price_per_hour_nano()
    earning = await Earning.objects.aget(rental=rental)
    assert earning.amount_nano == charged * 80 // 100 and earning.status == "held"
    await host.close()


async def test_it_refuses_bad_rentals_with_clear_errors(
    canaries, api_key, machine_token, settings
):
    host = await _passing_host(machine_token, "rig")
    cases = [
        ({"device": 999999, "hours": 1}, 404, "device"),
        ({"device": host.device.id, "hours": 0}, 400, "hours"),
        ({"device": "x", "hours": 1}, 400, "device"),
    ]
    for body, status, param in cases:
        response = await _api("post", "/v1/rentals", api_key, body)
        assert response.status_code == status, (body, response.content)
        assert json.loads(response.content)["error"]["param"] == param
    settings.BALLAST_RENTAL_USD_PER_HOUR = "1000"
    response = await _api(
        "post", "/v1/rentals", api_key, {"device": host.device.id, "hours": 1}
    )
    assert response.status_code == 402
    settings.BALLAST_RENTAL_USD_PER_HOUR = "0.20"
    await _rent(host, api_key)
    response = await _api(
        "post", "/v1/rentals", api_key, {"device": host.device.id, "hours": 1}
    )
    assert response.status_code == 409
    response = await _api(
        "post",
        "/v1/chat/completions",
        api_key,
        {
            "model": "smollm2-135m-instruct",
            "messages": [{"role": "user", "content": "x"}],
            "placement": {"rental": "00000000-0000-0000-0000-000000000000"},
        },
    )
    assert response.status_code == 404
    await host.close()


async def test_the_renter_ends_a_rental_early(canaries, api_key, machine_token):
    host = await _passing_host(machine_token, "rig")
    rental = await _rent(host, api_key)
    await Rental.objects.filter(id=rental.id).aupdate(
        starts_at=timezone.now() - timedelta(minutes=30),
        billed_until=timezone.now() - timedelta(minutes=30),
    )
    response = await _api("delete", f"/v1/rentals/{rental.id}", api_key)
    assert json.loads(response.content)["status"] == "ended"
    txn = await LedgerTransaction.objects.aget(kind="rental")
    assert txn is not None
    await host.close()


async def test_rentals_cannot_commit_more_than_the_balance(
    canaries, machine_token, settings
):
    """Open rentals reserve their unbilled hours: a second rental that the balance
    could not also pay for is refused (no negative balance at settlement)."""
    from hosts.services import user_get_or_create
    from jobs.services import api_key_create

    settings.BALLAST_RENTAL_USD_PER_HOUR = "0.20"
    user = await database_sync_to_async(user_get_or_create)(email="neg@example.com")
    from billing.services import renter_top_up

    await database_sync_to_async(renter_top_up)(
        user=user, amount_nano=250_000_000, key="neg"
    )  # 0.25 USD: one hour, not two
    _, key = await database_sync_to_async(api_key_create)(user=user)
    first = await _passing_host(machine_token, "first")
    second = await _passing_host(machine_token, "second")
    response = await _api(
        "post", "/v1/rentals", key, {"device": first.device.id, "hours": 1}
    )
    assert response.status_code == 201
    response = await _api(
        "post", "/v1/rentals", key, {"device": second.device.id, "hours": 1}
    )
    assert response.status_code == 402
    await first.close()
    await second.close()
