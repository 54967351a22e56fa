"""Limits (issue 23 item 4; DESIGN.md "Limits and abuse"): requests per minute
and open jobs per API key, a renter's share of a model's queue, and sign-ups,
logins, password resets and tickets per address and account. A refused
request is a 429 in OpenAI's error shape with ``Retry-After`` and holds no
slot, no job and no charge. Counted through ``ballast.ratelimits`` (the
``limits`` library): in Redis with ``REDIS_URL``, shared by every process."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.test import AsyncClient

from billing.models import LedgerTransaction
from hosts.models import Device
from jobs.models import Job

from .helpers import chat_request, host_online

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def _assert_429(response) -> dict:
    assert response.status_code == 429, response.content
    assert int(response["Retry-After"]) >= 1
    error = json.loads(response.content)["error"]
    assert (
        error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    )
    return error


async def test_a_key_past_its_rate_gets_429_and_no_job(
    catalog, api_key, machine_token, settings
):
    settings.BALLAST_KEY_RATE = "2/minute"
    host = await host_online(machine_token, "rig", slots=4)
    for _ in range(2):
        answer = chat_request(api_key, stream=False)
        await host.answer(await host.recv_type("offer"), ["ok"])
        assert (await answer).status_code == 200
    jobs_before = await Job.objects.acount()
    charges_before = await LedgerTransaction.objects.acount()
    _assert_429(await chat_request(api_key, stream=False))
    assert await Job.objects.acount() == jobs_before
    assert await LedgerTransaction.objects.acount() == charges_before
    assert await host.ws.receive_nothing(timeout=0.2), "nothing offered"
    await host.close()


async def test_the_key_rate_holds_on_the_renter_websocket_too(
    catalog, api_key, settings
):
    from channels.testing import WebsocketCommunicator

    from ballast.asgi import application

    settings.BALLAST_KEY_RATE = "1/minute"
    ws = WebsocketCommunicator(
        application,
        "/ws/v1/chat/",
        headers=[(b"authorization", f"Bearer {api_key}".encode())],
    )
    assert (await ws.connect())[0]
    body = {"model": catalog.id, "messages": [{"role": "user", "content": "hi"}]}
    await ws.send_json_to(body)  # no live device: 503, but counted
    assert (await ws.receive_json_from(timeout=5))["status"] == 503
    refused = {"error": {"code": "busy"}}
    while refused["error"]["code"] == "busy":  # the first request's task ending
        await ws.send_json_to(body)
        refused = await ws.receive_json_from(timeout=5)
    assert refused["status"] == 429 and refused["retry_after"] >= 1
    assert refused["error"]["code"] == "rate_limit_exceeded"
    await ws.disconnect()


async def test_a_key_at_its_open_jobs_gets_429_holding_no_slot(
    catalog, api_key, machine_token, settings
):
    settings.BALLAST_KEY_MAX_JOBS = 1
    host = await host_online(machine_token, "rig", slots=2)
    first = chat_request(api_key, stream=False)
    offer = await host.recv_type("offer")
    _assert_429(await chat_request(api_key, stream=False))
    assert await Job.objects.acount() == 1
    assert (await Device.objects.aget(machine=host.machine)).slots_used == 1
    await host.answer(offer, ["ok"])
    assert (await first).status_code == 200
    answer = chat_request(api_key, stream=False)  # its place is free again
    await host.answer(await host.recv_type("offer"), ["ok"])
    assert (await answer).status_code == 200
    await host.close()


async def test_one_renter_cannot_fill_a_models_queue(
    catalog, api_key, machine_token, settings
):
    """Past its share, a renter's request that would wait is refused (429, no
    job); another renter still queues behind it."""
    from channels.db import database_sync_to_async

    from billing.money import usd_to_nano
    from billing.services import renter_top_up
    from hosts.services import user_get_or_create
    from jobs.services import api_key_create

    settings.BALLAST_QUEUE_SHARE_MIN = 1
    host = await host_online(machine_token, "rig", slots=1)
    busy = chat_request(api_key, stream=False)
    offer = await host.recv_type("offer")  # the one slot is taken
    queued = chat_request(api_key, stream=False)
    while not await Job.objects.filter(status=Job.Status.QUEUED).aexists():
        await asyncio.sleep(0.01)
    _assert_429(await chat_request(api_key, stream=False))
    assert await Job.objects.acount() == 2

    def other_renter() -> str:
        user = user_get_or_create(email="other@example.com")
        renter_top_up(user=user, amount_nano=usd_to_nano(1), key="other-in")
        return api_key_create(user=user)[1]

    other = chat_request(await database_sync_to_async(other_renter)(), stream=False)
    while await Job.objects.filter(status=Job.Status.QUEUED).acount() < 2:
        await asyncio.sleep(0.01)
    await host.answer(offer, ["ok"])
    assert (await busy).status_code == 200
    for _ in (queued, other):
        await host.answer(await host.recv_type("offer"), ["ok"])
    assert (await queued).status_code == 200 and (await other).status_code == 200
    await host.close()


@pytest.mark.parametrize(
    "url, setting, data",
    [
        ("/accounts/login/", "BALLAST_LOGIN_RATE", {"username": "a@example.com"}),
        ("/accounts/signup/", "BALLAST_SIGNUP_RATE", {"email": "a@example.com"}),
        (
            "/accounts/password_reset/",
            "BALLAST_PASSWORD_RESET_RATE",
            {"email": "a@example.com"},
        ),
    ],
)
async def test_account_forms_are_limited_per_address_and_account(
    db, settings, url, setting, data
):
    setattr(settings, setting, "2/minute")
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    client = AsyncClient(REMOTE_ADDR="10.0.0.1")
    for _ in range(2):
        assert (await client.post(url, {**data, "password": "x"})).status_code != 429
    refused = await client.post(url, {**data, "password": "x"})
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    # the same account from another address: still refused (per account)
    elsewhere = AsyncClient(REMOTE_ADDR="10.0.0.2")
    assert (await elsewhere.post(url, {**data, "password": "x"})).status_code == 429
    # another account from the first address: refused too (per address)
    other = {k: "b@example.com" for k in data}
    assert (await client.post(url, {**other, "password": "x"})).status_code == 429
    # a page read is never limited
    assert (await client.get(url)).status_code == 200


async def test_tickets_are_limited_per_account(db, owner, settings):
    from support.models import Ticket

    settings.BALLAST_TICKET_RATE = "1/minute"
    client = AsyncClient(REMOTE_ADDR="10.0.0.3")
    await client.aforce_login(owner)
    ticket = {"subject": "help", "body": "the rig is offline"}
    assert (await client.post("/support/", ticket)).status_code == 302
    refused = await client.post("/support/", ticket)
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert await Ticket.objects.acount() == 1


async def test_limits_are_shared_through_redis(settings):
    """Another process's limiter (a storage of its own on the same Redis) sees
    this one's hits: the counts are not in one process's memory."""
    if not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL: the embedded default counts in memory")
    import limits
    from limits import storage, strategies

    from ballast.ratelimits import limit_hit

    assert limit_hit("2/minute", "shared", "k") is None
    assert limit_hit("2/minute", "shared", "k") is None
    elsewhere = strategies.MovingWindowRateLimiter(
        storage.storage_from_string(settings.REDIS_URL)
    )
    assert not elsewhere.test(limits.parse("2/minute"), "shared", "k")
