"""Revoking a key or deactivating a renter closes that key's open renter
websockets at once (issue 23 item 2), not only at their next request: through
the channel layer (the key's group), so from any coordinator process. A job
running on the socket is cancelled, billed for what was delivered."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from accounts.services import api_key_revoke
from ballast.asgi import application
from jobs.models import ApiKey, Job
from jobs.services import api_key_create

from .helpers import host_online, job_closed, renter_ws

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def _idle_socket(api_key: str) -> WebsocketCommunicator:
    ws = WebsocketCommunicator(
        application,
        "/ws/v1/chat/",
        headers=[(b"authorization", f"Bearer {api_key}".encode())],
    )
    assert (await ws.connect())[0]
    assert await ws.receive_nothing(timeout=0.05)
    return ws


async def _closed_401(ws: WebsocketCommunicator) -> None:
    error = await ws.receive_json_from(timeout=5)
    assert error["type"] == "error" and error["status"] == 401, error
    assert error["error"]["code"] == "invalid_api_key"
    closed = await ws.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 4401}, closed


async def test_revoking_a_key_closes_its_idle_socket_at_once(api_key, renter):
    ws = await _idle_socket(api_key)
    key = await ApiKey.objects.aget(user=renter)
    assert await database_sync_to_async(api_key_revoke)(user=renter, key_id=key.id)
    await _closed_401(ws)


async def test_revoking_one_key_leaves_the_renters_other_keys_open(api_key, renter):
    _, other = await database_sync_to_async(api_key_create)(user=renter, name="b")
    ws = await _idle_socket(api_key)
    kept = await _idle_socket(other)
    key = await ApiKey.objects.filter(user=renter).order_by("id").afirst()
    await database_sync_to_async(api_key_revoke)(user=renter, key_id=key.id)
    await _closed_401(ws)
    assert await kept.receive_nothing(timeout=0.2)
    await kept.disconnect()


async def test_deactivating_the_renter_closes_the_socket_and_cancels_its_job(
    catalog, api_key, renter, machine_token
):
    host = await host_online(machine_token, "rig")
    ws = await renter_ws(api_key, "Count")
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], "One,")
    chunk = await ws.receive_json_from(timeout=5)
    assert chunk["choices"][0]["delta"]["content"] == "One,"
    renter.is_active = False
    await renter.asave()
    await _closed_401(ws)
    cancel = await host.recv_type("cancel")
    assert cancel["job"] == offer["job"]
    await host.cancelled(offer["job"])
    job = await job_closed(
        (await Job.objects.filter(renter=renter).afirst()).id  # the one job
    )
    assert job.status == Job.Status.CANCELLED and job.output_text == "One,"
    await host.close()
