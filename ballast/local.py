"""Process-local delivery: the channel layer's shortcut between a sender and a
reader that live in the same process (and event loop).

A job's coroutine and the connection of the machine running it talk through the
channel layer (DESIGN.md "How a request flows" 3–5), because in production they
may be in different coordinator processes. When they are in the same one, a
message need not go through Redis (or be copied by the in-memory layer): the
reader registers its channel here, and ``channel_send`` hands the message to it
directly. Order is kept: a sender's messages to one channel all take the same
path, since a reader is registered for its channel's whole life (a job's before
its offer goes out, a connection's before it is accepted). Messages from other
processes still arrive through the layer, which the reader keeps reading.

``BALLAST_LOCAL_DELIVERY=0`` turns the shortcut off (every message through the
layer), which the relay benchmark uses to measure the layers themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from django.conf import settings

# channel -> (the reader's event loop, its deliver function)
_readers: dict[str, tuple[asyncio.AbstractEventLoop, Callable[[dict], None]]] = {}


def reader_add(channel: str, deliver: Callable[[dict], None]) -> None:
    """Deliver messages for ``channel`` sent from this event loop to ``deliver``.

    ``deliver(message)`` runs in the sender's task and must not block; it may
    raise ``channels.exceptions.ChannelFull`` as a layer's ``send`` would.
    """
    _readers[channel] = (asyncio.get_running_loop(), deliver)


def reader_drop(channel: str) -> None:
    """Forget ``channel``'s reader, whatever it is (the channel is given back)."""
    _readers.pop(channel, None)


def reader_remove(channel: str, deliver: Callable[[dict], None]) -> None:
    """Stop delivering ``channel`` locally (only if ``deliver`` is still its reader)."""
    entry = _readers.get(channel)
    if entry is not None and entry[1] == deliver:
        del _readers[channel]


async def channel_send(layer, channel: str, message: dict) -> None:
    """Send ``message`` to ``channel``: to its reader in this process when there is
    one, else through ``layer``. The sender gives the message up (it is not copied).

    Raises what the layer's ``send`` raises (``ChannelFull``), or what the local
    reader raises (``ChannelFull`` when its inbox is full).
    """
    deliver = _reader_here(channel)
    if deliver is not None:
        deliver(message)
        return
    await layer.send(channel, message)


def _reader_here(channel: str) -> Callable[[dict], None] | None:
    """``channel``'s deliver function for a sender in this
    event loop, or None (none here, or local delivery off)."""
    entry = _readers.get(channel) if settings.BALLAST_LOCAL_DELIVERY else None
    if entry is None or entry[0] is not asyncio.get_running_loop():
        return None
    return entry[1]
