"""Machine tokens and the hello's challenge (issue 23 item 2; DESIGN.md "Limits
and abuse"): a token rotated or revoked from the machine's page stops at once
(its open connection closed through the channel layer), a deactivated owner's
machines are refused and closed, a retired machine is closed and refused, and
``hello`` must sign the connection's
challenge with the pinned key, so a token alone cannot take a machine over.
On the real ASGI application (``tests.hostsim.HostSim``)."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.test import AsyncClient
from django.urls import reverse

from ballast.asgi import application
from ballast.stack import port_free
from hosts.models import Machine
from trust.consumers import MachineConsumer
from tests.fuzz.host_run import KNOWN_TYPES
from tests.hostsim import HostSim
from tests.jobs.helpers import chat_request, host_online

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def _closed_with(host: HostSim, code: int) -> dict:
    """The error frame then the close (with ``code``) the host receives."""
    error = await host.recv_type("error")
    closed = await host.ws.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": code}, closed
    return error


async def _refused_at_connect(token: str) -> None:
    ws = WebsocketCommunicator(
        application,
        "/ws/host/",
        headers=[(b"authorization", f"Bearer {token}".encode())],
        subprotocols=["ballast.host.v1"],
    )
    connected, code = await ws.connect()
    assert not connected and code == 4401


async def _owner_client(owner) -> AsyncClient:
    client = AsyncClient()
    await client.aforce_login(owner)
    return client


async def test_a_rotated_token_closes_its_connection_and_stops(
    catalog, owner, machine_token
):
    host = await host_online(machine_token, "rig")
    client = await _owner_client(owner)
    url = reverse("hosts:machine_token_rotate", args=[host.machine.id])
    response = await client.post(url, {"confirm": "1"})
    assert response.status_code == 302
    await _closed_with(host, 4401)
    await _refused_at_connect(host.machine_token)
    page = (await client.get(response["Location"])).content.decode()
    new_token = page.split('id="agent-command">')[1].split("</pre>")[0].split()[-1]
    assert new_token.startswith("bm_") and new_token != host.machine_token
    renewed = HostSim(new_token)
    renewed.key = host.key  # the same agent, restarted with the new token
    assert (await renewed.connect())["type"] == "welcome"
    await renewed.close()


async def test_a_revoked_token_closes_its_connection_and_stops(
    catalog, owner, machine_token
):
    host = await host_online(machine_token, "rig")
    client = await _owner_client(owner)
    url = reverse("hosts:machine_token_revoke", args=[host.machine.id])
    assert (await client.post(url, {"confirm": "1"})).status_code == 302
    await _closed_with(host, 4401)
    await _refused_at_connect(host.machine_token)
    machine = await Machine.objects.aget(id=host.machine.id)
    assert machine.token_prefix == "" and machine.token_hash.startswith("revoked:")


async def test_a_retired_machine_is_closed_refused_and_its_jobs_go_elsewhere(
    catalog, owner, api_key, machine_token
):
    """Retiring from the machine's page (issue 24) closes the agent's connection
    at once; its token is refused afterwards; renters' work goes to others."""
    host = await host_online(machine_token, "old-rig")
    other = await host_online(machine_token, "new-rig")
    client = await _owner_client(owner)
    url = reverse("hosts:machine_retire", args=[host.machine.id])
    response = await client.post(url, {"confirm": "1"})
    assert response.status_code == 302 and response["Location"] == "/machines/"
    await _closed_with(host, 4401)
    await _refused_at_connect(host.machine_token)
    machine = await Machine.objects.aget(id=host.machine.id)
    assert machine.retired_at is not None
    answer = chat_request(api_key, stream=False, content="after the retirement")
    offer = await other.recv_type("offer")
    assert offer["messages"][0]["content"] == "after the retirement"
    await other.answer(offer, ["ok"])
    assert (await answer).status_code == 200
    await other.close()


async def test_rotation_needs_the_owner_and_the_confirmation(
    catalog, owner, stranger, machine_token
):
    host = await host_online(machine_token, "rig")
    url = reverse("hosts:machine_token_rotate", args=[host.machine.id])
    stranger_client = await _owner_client(stranger)
    assert (await stranger_client.post(url, {"confirm": "1"})).status_code == 404
    owner_client = await _owner_client(owner)
    assert (await owner_client.post(url, {})).status_code == 302  # not confirmed
    assert (await owner_client.get(url)).status_code == 405
    assert await host.ws.receive_nothing(timeout=0.2)
    before = host.machine.token_hash
    assert (await Machine.objects.aget(id=host.machine.id)).token_hash == before
    await host.close()


async def test_a_deactivated_owners_machine_is_closed_and_refused(
    catalog, owner, machine_token
):
    host = await host_online(machine_token, "rig")
    owner.is_active = False
    await owner.asave()
    await _closed_with(host, 4401)
    await _refused_at_connect(host.machine_token)


async def test_a_hello_without_the_challenges_proof_is_refused(catalog, machine_token):
    """An agent of before the challenge (docs/protocol-notes.md 2026-12-01)."""
    _, token = await database_sync_to_async(machine_token)("rig")
    host = HostSim(token)
    await host.connect(hello=False)
    await host.send(host.hello_frame(proof=None))
    error = await _closed_with(host, 4426)
    assert "proof" in error["message"]


@pytest.mark.parametrize("forgery", ["other_nonce", "other_key"])
async def test_a_hello_with_a_wrong_proof_is_refused(catalog, machine_token, forgery):
    _, token = await database_sync_to_async(machine_token)("rig")
    host = HostSim(token)
    await host.connect(hello=False)
    proof = (
        host.proof(nonce="a nonce of another connection")
        if forgery == "other_nonce"
        else host.proof(key=Ed25519PrivateKey.generate())
    )
    await host.send(host.hello_frame(proof=proof))
    await _closed_with(host, 4403)


async def test_a_token_alone_cannot_take_the_machine_over(
    catalog, api_key, machine_token
):
    """Another process with the token but not the pinned key neither replaces
    the agent's connection nor receives renters' prompts."""
    host = await host_online(machine_token, "rig")
    thief = HostSim(host.machine_token)  # the same token, its own key
    await thief.connect(hello=False)
    await thief.send(thief.hello_frame())  # proves its own key: not the pinned one
    await _closed_with(thief, 4403)
    replayed = HostSim(host.machine_token)
    replayed.key = Ed25519PrivateKey.generate()
    await replayed.connect(hello=False)
    # the real key's public half, with a proof it cannot make
    await replayed.send(
        replayed.hello_frame(public_key=host.public_key, proof=replayed.proof())
    )
    await _closed_with(replayed, 4403)
    answer = chat_request(api_key, stream=False, content="for the real agent")
    offer = await host.recv_type("offer")
    assert offer["messages"][0]["content"] == "for the real agent"
    await host.answer(offer, ["ok"])
    assert (await answer).status_code == 200
    await host.close()


async def test_a_machine_socket_opened_while_redis_is_down_is_told_to_retry(
    catalog, machine_token, settings
):
    """Redis away while the socket's count is taken (a restart): the socket
    is accepted, told why in an ``error`` frame and closed 1013 (try again
    later); no 500 handshake, and the machine's next connection, with Redis
    back, is welcomed."""
    _, token = await database_sync_to_async(machine_token)()
    redis_url = settings.REDIS_URL
    settings.REDIS_URL = f"redis://127.0.0.1:{port_free()}/0"  # nothing listens
    ws = WebsocketCommunicator(
        application,
        "/ws/host/",
        headers=[(b"authorization", f"Bearer {token}".encode())],
        subprotocols=["ballast.host.v1"],
    )
    connected, subprotocol = await ws.connect(timeout=10)
    assert connected and subprotocol == "ballast.host.v1"
    error = await ws.receive_json_from(timeout=10)
    assert error["type"] == "error" and "reconnect" in error["message"], error
    assert await ws.receive_output(timeout=5) == {"type": "websocket.close", "code": 1013}
    settings.REDIS_URL = redis_url
    host = HostSim(token)
    assert (await host.connect())["type"] == "welcome"
    await host.close()


async def test_only_the_protocols_frame_types_reach_a_handler(catalog, machine_token):
    """A frame named after one of the consumer's own methods (``unreadable``,
    with or without the handlers' ``frame_`` prefix) is an unknown frame
    type, and the connection goes on (fresh-eyes review 5: ``{"type":
    "unreadable"}`` reached an internal hook and crashed the connection)."""
    host = await host_online(machine_token, "rig")
    frame_types = KNOWN_TYPES | {"scores"}
    names = {n.removeprefix("frame_") for n in dir(MachineConsumer)} - frame_types
    for kind in sorted(n for n in names if n.isidentifier()):
        await host.send({"type": kind})
        error = await host.recv_type("error")
        assert error["message"].startswith("unknown frame type"), (kind, error)
    await host.close()
