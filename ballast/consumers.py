"""What Ballast's websocket consumers share."""

from __future__ import annotations

import asyncio
import contextlib

from channels.consumer import get_handler_name
from channels.exceptions import ChannelFull, StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings

from ballast import local
from ballast.sockets import SocketCap, socket_forget, socket_release, socket_take

# messages from this process that may wait for a connection's handlers (the
# in-memory layer's bound: ballast.settings CHANNEL_LAYERS capacity)
LOCAL_INBOX_MESSAGES = 5000
# how long (s) after a connection closed this process's messages to it still go
# to its ``undelivered`` (a sender that picked the connection as it closed)
CLOSED_READER_S = 10.0
# close codes (docs/protocol-notes.md "Access"): no hello (host) or request
# (renter) within BALLAST_HELLO_TIMEOUT_S; too many open sockets; opened while
# the database or Redis could not be reached (RFC 6455 "Try Again Later")
CLOSE_NO_GREETING = 4408
CLOSE_TOO_MANY = 4429
CLOSE_TRY_LATER = 1013


class DirectDispatchConsumer(AsyncWebsocketConsumer):
    """A websocket consumer whose messages reach their handler directly.

    Two per-message costs of Channels' consumers are gone; the semantics stay
    (one handler at a time, each source in order, ``StopConsumer`` ends it, an
    exception in a handler ends the connection):

    * Channels runs ``close_old_connections`` on the database thread before every
      message; Ballast's consumers reach the database only through
      ``ballast.db.db_call``, which does that itself, so a relayed token costs no
      database work at all.
    * Channels' ``await_many_dispatch`` makes a new task and an ``asyncio.wait``
      for every message (a host's token frame included). Here each source (the
      socket, the connection's channel, and messages sent from this process,
      which skip the layer: ``ballast.local``) has one long-lived reader that
      hands its messages to the handlers under one lock: a frame costs one task
      switch.

    Every Ballast socket is also held to the access limits (docs/protocol-notes.md
    "Access"): its place in the open-socket counts (``sockets_take``, given back
    whenever the connection ends), a deadline for its first word
    (``greeting_deadline_start``) and ``refuse``, after which its frames are
    dropped.
    """

    # set by ``refuse``: the socket is closing, frames that still come are dropped
    refused = False
    _socket_id: str | None = None  # this socket's place in its counts (sockets_take)
    _greeting_timer: asyncio.TimerHandle | None = None

    async def __call__(self, scope: dict, receive, send) -> None:
        """Run the connection: ASGI ``scope``/``receive``/``send`` (see class doc)."""
        try:
            await self._connection_run(scope, receive, send)
        finally:
            if self._greeting_timer is not None:
                self._greeting_timer.cancel()
            if self._socket_id is not None:
                # renewal stops at once; the entries lapse within a lease if the
                # release cannot finish (Redis away, the server stopping)
                keys = socket_forget(self._socket_id)
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.to_thread(socket_release, self._socket_id, keys)

    async def sockets_take(self, *caps: SocketCap) -> SocketCap | None:
        """Count this socket against ``caps`` and against its client address's
        cap (``BALLAST_SOCKETS_PER_ADDRESS``), all or none, until it ends
        (``ballast.sockets``). Returns None when counted, else the cap that is
        full (nothing counted). Raises ``redis.RedisError`` when Redis is away."""
        client = self.scope.get("client")
        if client and client[0]:
            caps = (
                *caps,
                SocketCap("address", client[0], "BALLAST_SOCKETS_PER_ADDRESS"),
            )
        self._socket_id, full = await asyncio.to_thread(socket_take, list(caps))
        return full

    def greeting_deadline_start(self) -> None:
        """In ``BALLAST_HELLO_TIMEOUT_S`` s, call the handler ``greeting_deadline``
        (in turn with the socket's frames, so after a frame that came first)."""
        self._greeting_timer = asyncio.get_running_loop().call_later(
            settings.BALLAST_HELLO_TIMEOUT_S,
            self._local_deliver,
            {"type": "greeting.deadline"},
        )

    async def refuse(self, code: int) -> None:
        """Close the socket with ``code``; frames that still arrive are dropped."""
        self.refused = True
        await self.close(code=code)

    async def _connection_run(self, scope: dict, receive, send) -> None:
        self.scope = scope
        self.base_send = send
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        if self.channel_layer is None:
            with contextlib.suppress(StopConsumer):
                await self._read(receive, asyncio.Lock())
            return
        self.channel_name = await self.channel_layer.new_channel()
        self.channel_receive = self._channel_receive
        lock = asyncio.Lock()
        # messages sent from this process skip the layer (ballast.local)
        self._local_inbox: asyncio.Queue[dict] = asyncio.Queue(LOCAL_INBOX_MESSAGES)
        local.reader_add(self.channel_name, self._local_deliver)
        # one receive stays pending on the channel for the connection's life (the
        # Redis pub/sub layer can lose its subscription when a receive is cancelled)
        socket_reader = asyncio.current_task()
        readers = [
            asyncio.ensure_future(
                self._read(self._channel_receive, lock, socket_reader.cancel)
            ),
            asyncio.ensure_future(
                self._read(self._local_inbox.get, lock, socket_reader.cancel)
            ),
        ]

        def channel_reader_ended(task: asyncio.Task) -> None:
            if not task.cancelled() and task.exception() is not None:
                socket_reader.cancel()  # end the connection as Channels would

        for reader in readers:
            reader.add_done_callback(channel_reader_ended)
        try:
            await self._read(receive, lock)
        except StopConsumer:
            pass
        except asyncio.CancelledError:
            failed = next(
                (
                    reader.exception()
                    for reader in readers
                    if reader.done()
                    and not reader.cancelled()
                    and reader.exception() is not None
                ),
                None,
            )
            if failed is None:
                raise
            if not isinstance(failed, StopConsumer):
                raise failed from None
        finally:
            local.reader_remove(self.channel_name, self._local_deliver)
            for reader in readers:
                reader.remove_done_callback(channel_reader_ended)
                reader.cancel()
            for reader in readers:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reader
            self._closed_reader_add()

    def undelivered(self, message: dict) -> None:
        """A message of this process that reached the connection after it closed
        (still in its inbox, waiting for its handler, or sent within
        ``CLOSED_READER_S`` of the close). Does nothing here; must not block."""

    def _closed_reader_add(self) -> None:
        """Hand what this process sent to the closed connection to ``undelivered``:
        what waits in its inbox now, and for ``CLOSED_READER_S`` what comes."""
        while not self._local_inbox.empty():
            self.undelivered(self._local_inbox.get_nowait())
        local.reader_add(self.channel_name, self.undelivered)
        asyncio.get_running_loop().call_later(
            CLOSED_READER_S, local.reader_remove, self.channel_name, self.undelivered
        )

    def _local_deliver(self, message: dict) -> None:
        """Queue a message sent from this process (``ballast.local``); raises
        ChannelFull, as the layer would, past ``LOCAL_INBOX_MESSAGES`` waiting."""
        try:
            self._local_inbox.put_nowait(message)
        except asyncio.QueueFull:
            raise ChannelFull(f"{self.channel_name}: inbox full") from None

    async def _channel_receive(self) -> dict:
        return await self.channel_layer.receive(self.channel_name)

    async def _read(self, source, lock: asyncio.Lock, on_failure=None) -> None:
        """Hand every message of ``source`` to its handler, one handler at a time.

        When a handler raises, ``on_failure()`` runs before the lock is released,
        so no other handler starts after a failed one (as in Channels).
        """
        dispatch = self.dispatch
        while True:
            message = await source()
            try:
                await lock.acquire()
            except asyncio.CancelledError:  # closed before its handler could run
                self.undelivered(message)
                raise
            try:
                await dispatch(message)
            except Exception:
                if on_failure is not None:
                    on_failure()
                raise
            finally:
                lock.release()

    async def dispatch(self, message: dict) -> None:
        if self.refused and message["type"] == "websocket.receive":
            return  # closing: a frame after the refusal changes nothing
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)
