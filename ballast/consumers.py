"""What Ballast's websocket consumers share."""

from __future__ import annotations

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer


class DirectDispatchConsumer(AsyncWebsocketConsumer):
    """A websocket consumer whose messages reach their handler directly.

    Channels runs ``close_old_connections`` on the database thread before every
    message; Ballast's consumers reach the database only through
    ``ballast.db.db_call``, which does that itself, so a relayed token costs no
    database work at all.
    """

    async def dispatch(self, message: dict) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)
