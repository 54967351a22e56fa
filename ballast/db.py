"""Running ORM work from async code.

``db_call(func)`` wraps a sync service like Channels' ``database_sync_to_async``
(old connections closed around each call). On PostgreSQL it runs on the shared
thread pool instead of the single thread that ``thread_sensitive=True`` gives every
consumer of a process, so one machine's heartbeat or claim never waits behind
another's database work; each service is its own transaction, so no call depends
on the thread of the one before. On SQLite (one writer) calls stay on that one
thread, where they would otherwise only contend for the file's lock.
"""

from __future__ import annotations

from collections.abc import Callable

from channels.db import database_sync_to_async
from django.conf import settings


def db_call(func: Callable) -> Callable:
    """``func`` as a coroutine function running in a worker thread (see module doc)."""
    sqlite = settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
    return database_sync_to_async(func, thread_sensitive=sqlite)
