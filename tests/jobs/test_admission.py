"""No offer leaves before a request is admitted (CONVENTIONS.md "Speed without a
second path"): a revoked key, a deactivated renter and a spent credit send
nothing to any host, over HTTP and on a renter websocket opened before the key
was revoked; a live key's request reaches the host (the control)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from billing.models import Account
from billing.services import account_for, ledger_post
from hosts.services import user_get_or_create
from jobs.models import ApiKey, Job
from jobs.services import api_key_create

from .helpers import chat_request, host_online, renter_ws

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SECRET = "a prompt no host may see"


async def _nothing_offered(host) -> None:
    """No frame at all reached the host within 0.3 s (an offer would have come
    within milliseconds: the control below)."""
    assert await host.ws.receive_nothing(timeout=0.3), "a frame reached the host"
    assert not await Job.objects.filter(messages__0__content=SECRET).aexists()


async def test_a_live_keys_request_reaches_the_host(catalog, api_key, machine_token):
    host = await host_online(machine_token, "rig")
    answer = chat_request(api_key, stream=False, content=SECRET)
    offer = await host.recv_type("offer")
    assert offer["messages"][0]["content"] == SECRET
    await host.answer(offer, ["ok"])
    assert (await answer).status_code == 200
    await host.close()


async def test_a_revoked_key_sends_nothing_to_a_host(
    catalog, api_key, renter, machine_token
):
    host = await host_online(machine_token, "rig")
    await ApiKey.objects.filter(user=renter).aupdate(revoked_at=timezone.now())
    refused = await chat_request(api_key, content=SECRET)
    assert refused.status_code == 401
    await _nothing_offered(host)
    await host.close()


async def test_a_deactivated_renter_sends_nothing_to_a_host(
    catalog, api_key, renter, machine_token
):
    host = await host_online(machine_token, "rig")
    renter.is_active = False
    await renter.asave()
    refused = await chat_request(api_key, content=SECRET)
    assert refused.status_code == 401
    await _nothing_offered(host)
    await host.close()


async def test_a_spent_credit_sends_nothing_to_a_host(catalog, machine_token):
    from channels.db import database_sync_to_async

    def spent_renter() -> str:
        user = user_get_or_create(email="spent@example.com")
        credit = account_for(kind=Account.Kind.RENTER_CREDIT, user=user)
        funding = account_for(kind=Account.Kind.FUNDING)
        ledger_post(kind="top_up", key="spent-in", legs=[(funding, -10), (credit, 10)])
        ledger_post(kind="charge", key="spent-out", legs=[(credit, -10), (funding, 10)])
        return api_key_create(user=user)[1]

    key = await database_sync_to_async(spent_renter)()
    host = await host_online(machine_token, "rig")
    refused = await chat_request(key, content=SECRET)
    assert refused.status_code == 402
    await _nothing_offered(host)
    await host.close()


async def test_a_key_revoked_while_its_websocket_is_open_sends_nothing(
    catalog, api_key, renter, machine_token
):
    """The key is checked with every request on the socket, not only when it opens."""
    host = await host_online(machine_token, "rig")
    ws = await renter_ws(api_key, "first")
    offer = await host.recv_type("offer")
    await host.answer(offer, ["ok"])
    while (await ws.receive_json_from(timeout=5)).get("type") != "done":
        pass
    await ApiKey.objects.filter(user=renter).aupdate(revoked_at=timezone.now())
    await ws.send_json_to(
        {"model": catalog.id, "messages": [{"role": "user", "content": SECRET}]}
    )
    error = await ws.receive_json_from(timeout=5)
    assert error["type"] == "error" and error["status"] == 401
    assert (await ws.receive_output(timeout=5))["type"] == "websocket.close"
    await _nothing_offered(host)
    await host.close()
