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

A job's channel (``channel_new``) is one of its process's mailbox: the
mailbox is one channel of the layer, made and read once per process (event
loop), and a job's channel is ``<mailbox>.<key>``. A message to it from
another process goes through the layer to the mailbox, naming the job's
channel, and the mailbox's reader hands it to the channel's reader here: no
subscription, no reader task and no round trip per job (the Redis pub/sub
layer subscribes every channel it makes). A job's channel keeps what arrives
before its reader is added, as a layer's channel would.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from channels.exceptions import ChannelFull
from django.conf import settings

log = logging.getLogger("ballast.local")

# channel -> (the reader's event loop, its deliver function)
_readers: dict[str, tuple[asyncio.AbstractEventLoop, Callable[[dict], None]]] = {}

MAILBOX_PREFIX = "mailbox."
"""What the layer's name of a process's mailbox starts with (after the
layer's own prefix)."""
MAILBOX_PAUSE_S = 0.5
"""The pause after a failed read of the mailbox, before the next (s)."""
_TO = "__mailbox_to__"  # the job's channel, in a message sent to its mailbox
# event loop -> its mailbox's name and reader task
_mailboxes: dict[asyncio.AbstractEventLoop, tuple[str, asyncio.Task]] = {}


async def channel_new(layer) -> str:
    """A new job channel of this process's mailbox (``<mailbox>.<key>``), read
    here: what is sent to it is kept until ``reader_add`` names its reader.
    The mailbox is made (``layer.new_channel``) on the first call of this event
    loop, and read from then on."""
    loop = asyncio.get_running_loop()
    mailbox = _mailboxes.get(loop)
    if mailbox is None:
        name = await layer.new_channel(MAILBOX_PREFIX)
        mailbox = _mailboxes.get(loop)  # (another call made it meanwhile)
        if mailbox is None:
            mailbox = _mailboxes[loop] = (
                name,
                loop.create_task(_mailbox_read(layer, name)),
            )
    channel = f"{mailbox[0]}.{uuid.uuid4().hex}"
    _readers[channel] = (loop, _Held())
    return channel


def reader_add(channel: str, deliver: Callable[[dict], None]) -> None:
    """Deliver messages for ``channel`` sent from this event loop to ``deliver``
    (first those a job channel kept until now, in order).

    ``deliver(message)`` runs in the sender's task and must not block; it may
    raise ``channels.exceptions.ChannelFull`` as a layer's ``send`` would.
    """
    entry = _readers.get(channel)
    _readers[channel] = (asyncio.get_running_loop(), deliver)
    if entry is not None and isinstance(entry[1], _Held):
        for message in entry[1].messages:
            deliver(message)


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
    mailbox, _, key = channel.rpartition(".")
    if MAILBOX_PREFIX in mailbox and len(key) == 32:  # a job channel: its mailbox
        await layer.send(mailbox, {**message, _TO: channel})
        return
    await layer.send(channel, message)


def _reader_here(channel: str) -> Callable[[dict], None] | None:
    """``channel``'s deliver function for a sender in this
    event loop, or None (none here, or local delivery off)."""
    entry = _readers.get(channel) if settings.BALLAST_LOCAL_DELIVERY else None
    if entry is None or entry[0] is not asyncio.get_running_loop():
        return None
    return entry[1]


class _Held:
    """A job channel's reader until ``reader_add``: keeps what arrives."""

    def __init__(self) -> None:
        self.messages: list[dict] = []

    def __call__(self, message: dict) -> None:
        self.messages.append(message)


async def _mailbox_read(layer, mailbox: str) -> None:
    """Hand every message of ``mailbox`` to the reader of the job channel it
    names, whatever ``BALLAST_LOCAL_DELIVERY`` says (the registry is how the
    mailbox finds it); a message for a channel nobody reads any more is
    dropped, as the layer drops one for a channel nobody subscribes. Runs for
    the event loop's life."""
    while True:
        try:
            message = await layer.receive(mailbox)
        except Exception:  # the layer's server away: its client reconnects
            log.exception("reading this process's mailbox %s failed", mailbox)
            await asyncio.sleep(MAILBOX_PAUSE_S)
            continue
        entry = _readers.get(message.pop(_TO, ""))
        if entry is None:
            continue
        try:
            entry[1](message)
        except ChannelFull:
            log.warning(
                "a message for a full job channel dropped (%s)", message.get("type")
            )
