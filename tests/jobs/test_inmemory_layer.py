"""The embedded default's channel layer (``ballast.layers``): same behaviour as
Channels' in-memory layer — order, capacity, copies, expiry — at a lower cost."""

from __future__ import annotations

import asyncio

import pytest
from channels.exceptions import ChannelFull

from ballast import layers
from ballast.layers import InMemoryChannelLayer, message_copy


@pytest.mark.asyncio
async def test_messages_arrive_in_order_and_as_copies():
    layer = InMemoryChannelLayer(capacity=10)
    channel = await layer.new_channel("job.")
    nested = {"type": "host.done", "done": {"receipt": "r"}}
    flat = {"type": "host.token", "attempt": "a", "text": " the"}
    await layer.send(channel, flat)
    await layer.send(channel, nested)
    got_flat = await layer.receive(channel)
    got_nested = await layer.receive(channel)
    assert got_flat == flat and got_flat is not flat
    assert got_nested == nested and got_nested["done"] is not nested["done"]
    got_nested["done"]["receipt"] = "changed"
    assert nested["done"]["receipt"] == "r", "a receiver cannot change the sender's"
    assert channel not in layer.channels, "an emptied channel is forgotten"


@pytest.mark.asyncio
async def test_a_full_channel_refuses_the_message():
    layer = InMemoryChannelLayer(capacity=2)
    await layer.send("job.x", {"type": "a"})
    await layer.send("job.x", {"type": "b"})
    with pytest.raises(ChannelFull):
        await layer.send("job.x", {"type": "c"})
    assert (await layer.receive("job.x"))["type"] == "a"


@pytest.mark.asyncio
async def test_a_receive_waits_for_the_next_send():
    layer = InMemoryChannelLayer()
    waiting = asyncio.create_task(layer.receive("job.y"))
    await asyncio.sleep(0)
    assert not waiting.done()
    await layer.send("job.y", {"type": "slot.free"})
    assert (await asyncio.wait_for(waiting, 5)) == {"type": "slot.free"}


@pytest.mark.asyncio
async def test_expired_messages_are_still_dropped(monkeypatch):
    layer = InMemoryChannelLayer(expiry=0)
    monkeypatch.setattr(layers, "CLEAN_INTERVAL_S", 0.0)
    await layer.send("job.old", {"type": "stale"})
    await asyncio.sleep(0.01)  # past an expiry of 0 s
    waiting = asyncio.create_task(layer.receive("job.other"))
    await asyncio.sleep(0)
    assert "job.old" not in layer.channels, "the expired message is gone"
    waiting.cancel()


@pytest.mark.asyncio
async def test_invalid_names_are_refused():
    layer = InMemoryChannelLayer()
    with pytest.raises(TypeError):
        await layer.send("bad name!x!", {"type": "a"})


def test_message_copy_shares_nothing_mutable():
    flat = {"type": "t", "n": 1, "f": 0.5, "b": True, "none": None}
    assert message_copy(flat) == flat and message_copy(flat) is not flat
    nested = {"type": "t", "list": [1, 2]}
    copied = message_copy(nested)
    copied["list"].append(3)
    assert nested["list"] == [1, 2]
