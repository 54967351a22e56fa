"""The database layer: ORM work from async code, and the few places where
PostgreSQL and SQLite truly differ.

``db_call(func)`` wraps a sync service like Channels' ``database_sync_to_async``
(old connections closed around each call). On PostgreSQL it runs on the shared
thread pool instead of the single thread that ``thread_sensitive=True`` gives every
consumer of a process, so one machine's heartbeat or claim never waits behind
another's database work; each service is its own transaction, so no call depends
on the thread of the one before. On SQLite (one writer) calls stay on that one
thread, where they would otherwise only contend for the file's lock.

The fixed statements every job sends live beside it: ``ballast.writes``
(writes built from a model's fields) and ``ballast.rows`` (model instances
from a fixed SELECT).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import SyncToAsync
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction

log = logging.getLogger("ballast.db")


_own_thread: ThreadPoolExecutor | None = None


def db_call(func: Callable, *, own_thread: bool = False) -> Callable:
    """``func`` as a coroutine function running in a worker thread (see module doc).

    ``own_thread``: on PostgreSQL, a thread kept for such calls, never queued
    behind the shared pool's work (the liveness lease's renewal, which must land
    within ``BALLAST_LEASE_S`` however many requests the process is serving:
    ``hosts.liveness``); on SQLite the one thread, as every call.

    On PostgreSQL the call is the loop's executor run of ``func`` in a copy of
    the caller's context, old connections closed around it, as Channels'
    ``database_sync_to_async`` with ``thread_sensitive=False`` runs it, without
    its per-call costs (the wrapper built and inspected at every call, every
    context variable copied back and its Local storage re-homed afterwards,
    about 1.5 ms of the event loop's time per job: docs/performance.md):
    what a service sets in context variables stays in its thread. The worker
    knows the calling loop, so an ``async_to_sync`` inside ``func`` runs on
    it, as under asgiref. On SQLite calls keep asgiref's one thread, with its
    guard against a nested call waiting for that thread."""
    global _own_thread
    sqlite = settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
    if sqlite:
        return database_sync_to_async(func, thread_sensitive=True)
    executor = None  # the loop's default pool
    if own_thread:
        if _own_thread is None:
            _own_thread = ThreadPoolExecutor(1, thread_name_prefix="ballast-own")
        executor, func = _own_thread, functools.partial(_connection_returned, func)

    @functools.wraps(func)
    async def call(*args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            executor,
            functools.partial(
                _in_worker, loop, contextvars.copy_context(), func, args, kwargs
            ),
        )

    return call


def _in_worker(loop, context: contextvars.Context, func: Callable, args, kwargs):
    """Run ``func(*args, **kwargs)`` in ``context`` on a worker thread of
    ``loop``'s, its thread's old database connections closed before and after
    (``close_old_connections``, as Channels does)."""
    SyncToAsync.threadlocal.main_event_loop = loop
    SyncToAsync.threadlocal.main_event_loop_pid = os.getpid()
    return context.run(_closed_around, func, args, kwargs)


def _closed_around(func: Callable, args, kwargs):
    close_old_connections()
    try:
        return func(*args, **kwargs)
    finally:
        close_old_connections()


def _connection_returned(func: Callable, *args, **kwargs):
    """``func(*args, **kwargs)``, then the thread's connection back to the pool.

    The kept thread must hold no connection between calls: one it kept was
    seen to survive Channels' ``close_old_connections`` under the test
    harness, and a session the server ended meanwhile (a restart, a
    terminated backend) then failed every later renewal; given back, the next
    call takes a checked one from the pool (``ballast.dbpool``)."""
    try:
        return func(*args, **kwargs)
    finally:
        connection.close()


def db_call_retried(
    func: Callable,
    *,
    tries: int = 2,
    when: Callable[[DatabaseError], bool] | None = None,
    backoff_s: float = 0.0,
) -> Callable:
    """``db_call(func)`` (keyword arguments), called up to ``tries`` times while
    it raises a DatabaseError that ``when(exc)`` accepts (any, by default);
    each failure before the last is logged, and the next try waits
    ``backoff_s`` s, twice as long after each failure (0: at once). For work that is safe to repeat
    (the end of a job: one already closed is returned as it is, its charge is
    posted once by its key): a connection the server closed fails the call that
    used it and the next try gets another (the pool checks what it hands out);
    a transaction chosen as a deadlock's victim was rolled back whole
    (``lock_conflict``). Raises the last failure, or one ``when`` refuses."""
    call = db_call(func)

    async def retried(**kwargs):
        pause = backoff_s
        for tries_left in range(tries - 1, -1, -1):
            try:
                return await call(**kwargs)
            except DatabaseError as exc:
                if not tries_left or (when is not None and not when(exc)):
                    raise
                log.warning("%s failed (%s); once more", func.__name__, exc)
            if pause:
                await asyncio.sleep(pause)
                pause *= 2
        raise AssertionError("tries must be at least 1")

    return retried


# the ends of attempts and jobs ride through a database restart: 8 tries, 0.1 s
# apart and doubling (12.7 s of pauses in all), inside the job's lease (30 s),
# which its coroutine keeps renewing meanwhile
DURABLE_TRIES = 8
DURABLE_BACKOFF_S = 0.1


def db_call_durable(func: Callable) -> Callable:
    """``db_call_retried(func)`` for a write that must not be lost to a database
    outage of a few seconds and is safe to repeat: an attempt's end (one already
    ended is left as it is), a job's end (one already closed is returned, its
    charge posted once by its key). Without it a job whose renter left while
    PostgreSQL restarted is closed by the reaper, and the text its open
    attempt delivered is never billed nor paid."""
    return db_call_retried(func, tries=DURABLE_TRIES, backoff_s=DURABLE_BACKOFF_S)


def skip_locked(of: str) -> str:
    """The clause that locks the selected row of table alias ``of`` and passes
    over rows other transactions hold (PostgreSQL: ``FOR NO KEY UPDATE OF …
    SKIP LOCKED``, which leaves inserts that only reference the row unblocked);
    on SQLite, whose write transactions run one at a time, nothing."""
    if on_postgresql():
        return f" FOR NO KEY UPDATE OF {of} SKIP LOCKED"
    return ""


def for_update(of: str, *, no_key: bool = False) -> str:
    """The clause that locks the selected row of table alias ``of`` until the
    transaction ends (PostgreSQL: ``FOR UPDATE OF …``; with ``no_key``, ``FOR
    NO KEY UPDATE OF …``, which leaves inserts that only reference the row
    unblocked); on SQLite, whose write transactions run one at a time, nothing."""
    if on_postgresql():
        return f" FOR {'NO KEY ' if no_key else ''}UPDATE OF {of}"
    return ""


def commit_unflushed_sql() -> str:
    """A FROM item that lets the current transaction commit without waiting for
    its WAL to reach the disk, riding in a statement the caller sends anyway
    (no round trip of its own): PostgreSQL ``CROSS JOIN (SELECT set_config(
    'synchronous_commit', 'off', true))``, as ``SET LOCAL synchronous_commit TO
    OFF`` would; SQLite: nothing (its own ``synchronous=NORMAL`` already). For a
    transaction that stores no money: a crash may lose it whole, never half;
    the end of the job, which stores the money, commits synchronously and so
    makes it durable too."""
    if on_postgresql():
        return (
            " CROSS JOIN (SELECT set_config('synchronous_commit', 'off', true))"
            " AS unflushed"
        )
    return ""


def lock_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` (Django's or psycopg's error) is PostgreSQL ending a
    transaction for a lock conflict (a deadlock's victim, a serialization
    failure): nothing of it was kept, so it may be sent again."""
    from psycopg import errors

    kinds = (errors.DeadlockDetected, errors.SerializationFailure)
    return isinstance(exc, kinds) or isinstance(exc.__cause__, kinds)


def on_postgresql() -> bool:
    """Whether the default database is PostgreSQL (else SQLite): the one place
    that asks (CONVENTIONS.md "Speed without a second path")."""
    return connection.vendor == "postgresql"

