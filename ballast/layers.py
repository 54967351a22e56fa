"""The embedded default's channel layer: Channels' in-memory layer, cheaper per message.

Every relayed token is one message (host connection → the job's coroutine), so the
per-message cost of the layer is part of every token's cost. Channels'
``InMemoryChannelLayer`` scans every queue of the process for expired messages on
each ``receive``, builds a new ``asyncio.Queue`` on every ``send`` and ``receive``
even when the channel has one (``setdefault``'s default is evaluated first), and
deep-copies every message. ``InMemoryChannelLayer`` here behaves the same — the
same capacity (``ChannelFull``), the same expiry, the same copies a receiver may
mutate — with:

* the expiry scan run at most once per ``CLEAN_INTERVAL_S`` (a message is still
  dropped once older than ``expiry``, at most ``CLEAN_INTERVAL_S`` later than
  Channels would; expiry only matters for messages nobody receives);
* a queue built only for a channel that has none;
* a flat message (values ``str``/``int``/``float``/``bool``/``None``, which are
  immutable) copied with ``dict(message)``, which is what a deep copy of it
  gives; nested messages are deep-copied as before.
"""

from __future__ import annotations

import asyncio
import time
from copy import deepcopy

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer as ChannelsInMemoryChannelLayer

CLEAN_INTERVAL_S = 1.0
_IMMUTABLE = (str, int, float, bool, type(None))


def message_copy(message: dict) -> dict:
    """A copy of ``message`` that shares nothing mutable with it (deep-copy semantics)."""
    for value in message.values():
        if not isinstance(value, _IMMUTABLE):
            return deepcopy(message)
    return dict(message)


class InMemoryChannelLayer(ChannelsInMemoryChannelLayer):
    """Channels' in-memory layer with the per-message costs above removed.

    Same API and errors: ``send`` raises ``ChannelFull`` past ``capacity`` messages
    on a channel, ``TypeError`` for an invalid name; one process only (DESIGN.md:
    the embedded default is one coordinator process).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._cleaned_at = 0.0

    def _queue(self, channel: str) -> asyncio.Queue:
        queue = self.channels.get(channel)
        if queue is None:
            queue = self.channels[channel] = asyncio.Queue(
                maxsize=self.get_capacity(channel)
            )
        return queue

    async def send(self, channel: str, message: dict) -> None:
        """Put a copy of ``message`` on ``channel``; ``ChannelFull`` when it is full."""
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        assert "__asgi_channel__" not in message
        try:
            self._queue(channel).put_nowait(
                (time.time() + self.expiry, message_copy(message))
            )
        except asyncio.QueueFull:
            raise ChannelFull(channel) from None

    async def receive(self, channel: str) -> dict:
        """The first message that arrives on ``channel`` (waits for one)."""
        self.require_valid_channel_name(channel)
        now = time.monotonic()
        if now - self._cleaned_at >= CLEAN_INTERVAL_S:
            self._cleaned_at = now
            self._clean_expired()
        queue = self._queue(channel)
        try:
            _, message = await queue.get()
        finally:
            if queue.empty() and self.channels.get(channel) is queue:
                del self.channels[channel]
        return message
