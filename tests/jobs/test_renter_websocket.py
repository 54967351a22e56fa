"""The renter websocket (``/ws/v1/chat/``): an answer as chunks then ``done``,
a refused key, bad JSON and a lost database answered with their status.
"""

from __future__ import annotations

import pytest

from .helpers import host_online
from .helpers import renter_ws as renter_ws_open

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_it_answers_the_renter_websocket_with_chunks_then_done(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "rig")
    renter_ws = await renter_ws_open(api_key, "Hi")
    offer = await host.recv_type("offer")
    await host.answer(offer, ["Hi", "!"])
    messages = []
    while True:
        message = await renter_ws.receive_json_from(timeout=5)
        messages.append(message)
        if message.get("type") == "done":
            break
    assert (
        "".join(m["choices"][0]["delta"].get("content", "") for m in messages[:-1])
        == "Hi!"
    )
    assert messages[-2]["choices"][0]["finish_reason"] == "stop"
    assert (
        messages[-1]["finish_reason"] == "stop"
        and messages[-1]["usage"]["completion_tokens"] > 0
    )
    await renter_ws.disconnect()
    await host.close()


async def test_it_refuses_a_renter_websocket_without_a_valid_key(catalog):
    from channels.testing import WebsocketCommunicator

    from ballast.asgi import application

    ws = WebsocketCommunicator(
        application, "/ws/v1/chat/", headers=[(b"authorization", b"Bearer nope")]
    )
    connected, _ = await ws.connect()
    assert connected, (
        "accepted, to say why in a message (a refused handshake is a bare 403)"
    )
    error = await ws.receive_json_from(timeout=5)
    assert error["type"] == "error" and error["status"] == 401
    assert error["error"]["code"] == "invalid_api_key"
    assert (await ws.receive_output(timeout=5)) == {
        "type": "websocket.close",
        "code": 4401,
    }


async def test_the_renter_websocket_answers_bad_json_and_a_lost_database_with_status(
    catalog, api_key, monkeypatch
):
    """Every error message of the renter websocket names its status; the
    coordinator's own failure is an error message too, not a silent socket."""
    from channels.testing import WebsocketCommunicator
    from django.db import OperationalError

    from ballast.asgi import application
    from jobs import consumers

    ws = WebsocketCommunicator(
        application,
        "/ws/v1/chat/",
        headers=[(b"authorization", f"Bearer {api_key}".encode())],
    )
    assert (await ws.connect())[0]
    await ws.send_to(text_data="{not json")
    error = await ws.receive_json_from(timeout=5)
    assert (error["type"], error["status"], error["error"]["code"]) == (
        "error",
        400,
        "invalid_json",
    )
    await ws.send_to(bytes_data=b'{"model": "m"}')
    error = await ws.receive_json_from(timeout=5)
    assert error["status"] == 400 and "text message" in error["error"]["message"]

    def lost(**kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(consumers.renter, "job_open", lost)
    await ws.send_json_to(
        {"model": catalog.id, "messages": [{"role": "user", "content": "Hi"}]}
    )
    error = await ws.receive_json_from(timeout=5)
    assert (error["status"], error["error"]["code"]) == (503, "service_unavailable")
    await ws.disconnect()
