"""``ballast.consumers.DirectDispatchConsumer``: Channels' consumer semantics (one
handler at a time, each source in order, StopConsumer ends it quietly, a handler's
exception ends the connection) with one long-lived reader per source."""

from __future__ import annotations

import asyncio

import pytest
from channels.exceptions import StopConsumer
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from ballast.consumers import DirectDispatchConsumer

# (Channels' websocket_disconnect closes old database connections)
pytestmark = pytest.mark.django_db(transaction=True)


class Probe(DirectDispatchConsumer):
    """Holds a socket frame open on request; reports what the layer handlers saw."""

    instances: list[Probe] = []

    async def __call__(self, scope, receive, send) -> None:
        self.socket_frame_taken = asyncio.Event()
        self.layer_handler_entered = asyncio.Event()
        self.records: list[str] = []

        async def receive_noted() -> dict:
            message = await receive()
            if message["type"] == "websocket.receive":
                self.socket_frame_taken.set()
            return message

        await super().__call__(scope, receive_noted, send)

    async def connect(self) -> None:
        self.busy = False
        self.release = asyncio.Event()
        self.layer_message_taken = asyncio.Event()
        Probe.instances.append(self)
        await self.accept()
        await self.send(text_data=self.channel_name)

    async def _channel_receive(self) -> dict:
        message = await super()._channel_receive()
        self.layer_message_taken.set()
        return message

    async def receive(self, text_data=None, bytes_data=None) -> None:
        if text_data == "record":
            self.records.append(text_data)
            return
        if text_data == "hold":
            self.busy = True
            await self.release.wait()
            self.busy = False
            await self.send(text_data="released")
        else:
            await self.send(text_data=f"echo {text_data}")

    async def probe_ping(self, message: dict) -> None:
        await self.send(text_data=f"ping {message['n']} busy={self.busy}")

    async def probe_fail(self, message: dict) -> None:
        raise RuntimeError("a layer handler failed")

    async def probe_slowfail(self, message: dict) -> None:
        self.layer_handler_entered.set()
        await self.release.wait()
        raise RuntimeError("a slow layer handler failed")

    async def probe_stop(self, message: dict) -> None:
        raise StopConsumer


async def _connected() -> tuple[WebsocketCommunicator, Probe, str]:
    Probe.instances.clear()
    communicator = WebsocketCommunicator(Probe.as_asgi(), "/probe/")
    connected, _ = await communicator.connect()
    assert connected
    channel = await communicator.receive_from()
    return communicator, Probe.instances[0], channel


@pytest.mark.asyncio
async def test_a_layer_message_waits_for_the_running_socket_handler():
    communicator, probe, channel = await _connected()
    await communicator.send_to(text_data="hold")
    await get_channel_layer().send(channel, {"type": "probe.ping", "n": 1})
    # the channel's reader has the message; it must not run while "hold" runs
    await asyncio.wait_for(probe.layer_message_taken.wait(), 5)
    probe.release.set()
    assert await communicator.receive_from() == "released"
    assert await communicator.receive_from() == "ping 1 busy=False"
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_each_source_keeps_its_order():
    communicator, _, channel = await _connected()
    layer = get_channel_layer()
    for n in range(20):
        await communicator.send_to(text_data=str(n))
        await layer.send(channel, {"type": "probe.ping", "n": n})
    replies = [await communicator.receive_from() for _ in range(40)]
    echoes = [r for r in replies if r.startswith("echo")]
    pings = [r for r in replies if r.startswith("ping")]
    assert echoes == [f"echo {n}" for n in range(20)]
    assert pings == [f"ping {n} busy=False" for n in range(20)]
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_an_exception_in_a_layer_handler_ends_the_connection():
    communicator, _, channel = await _connected()
    await get_channel_layer().send(channel, {"type": "probe.fail"})
    with pytest.raises(RuntimeError, match="a layer handler failed"):
        await communicator.wait(timeout=5)


@pytest.mark.asyncio
async def test_stop_consumer_from_a_layer_handler_ends_it_quietly():
    communicator, _, channel = await _connected()
    await get_channel_layer().send(channel, {"type": "probe.stop"})
    await communicator.wait(timeout=5)  # returns: no exception


@pytest.mark.asyncio
async def test_a_message_without_a_handler_is_an_error():
    communicator, _, channel = await _connected()
    await get_channel_layer().send(channel, {"type": "probe.unknown"})
    with pytest.raises(ValueError, match="no handler for message type probe.unknown"):
        await communicator.wait(timeout=5)


@pytest.mark.asyncio
async def test_no_handler_starts_after_a_failed_one():
    communicator, probe, channel = await _connected()
    await get_channel_layer().send(channel, {"type": "probe.slowfail"})
    await asyncio.wait_for(probe.layer_handler_entered.wait(), 5)
    probe.socket_frame_taken.clear()
    await communicator.send_to(text_data="record")
    # the socket's reader holds the frame and waits for the failing handler's lock
    await asyncio.wait_for(probe.socket_frame_taken.wait(), 5)
    probe.release.set()
    with pytest.raises(RuntimeError, match="a slow layer handler failed"):
        await communicator.wait(timeout=5)
    assert probe.records == [], "the frame waiting behind the failure never ran"
