"""The database pool: connections the server closed are replaced at once.

Each process's psycopg pool (settings: ``DATABASES["default"]["OPTIONS"]["pool"]``,
built by the backend ``ballast.postgresql``) is a ``CheckedPool``. psycopg_pool's
own check (``ConnectionPool.check_connection``, what Django's
``CONN_HEALTH_CHECKS`` turns on) sends an empty query every time a connection is
handed out: a round trip before every database call of the request path (0.3–0.5
ms, docs/performance.md); and after a failed check the pool sleeps with backoff
(1 s, 2 s, 4 s …) before it tries the next connection, so after a database
restart every request waited seconds, up to the pool's timeout.

A connection idle in the pool has nothing to read unless the server spoke first,
and a server that ends a session (a restart, ``pg_terminate_backend``, an idle
timeout) does: its FATAL message and the end of the stream. So only a connection
with something to read is asked, and one that fails is closed and replaced at
once, without sleeping.
"""

from __future__ import annotations

import collections
import select

from psycopg import AsyncConnection, Error, pq
from psycopg_pool import AsyncConnectionPool, ConnectionPool


def _quiet(conn) -> bool | None:
    """False: ``conn`` is closed or not in the OK state; True: nothing waits on its
    socket; None: something does (the server spoke: ask it)."""
    if conn.closed or conn.pgconn.status != pq.ConnStatus.OK:
        return False
    waiting = select.poll()  # not select(): it fails on descriptors past 1023
    waiting.register(conn.pgconn.socket, select.POLLIN)
    return None if waiting.poll(0) else True


def connection_usable(conn) -> bool:
    """Whether ``conn`` (a psycopg connection idle in the pool) can be used.

    Closed, or not in the OK state: no. Nothing waiting on its socket: yes,
    without a round trip. Something waiting (the server's message, or the end of
    the stream): the empty query of ``ConnectionPool.check_connection`` decides
    (it consumes a harmless notice; a session the server ended fails it).
    """
    quiet = _quiet(conn)
    if quiet is not None:
        return quiet
    try:
        ConnectionPool.check_connection(conn)
    except Error:
        return False
    return True


async def async_connection_usable(conn: AsyncConnection) -> bool:
    """``connection_usable`` for an ``AsyncConnection`` (the ask awaited)."""
    quiet = _quiet(conn)
    if quiet is not None:
        return quiet
    try:
        await AsyncConnectionPool.check_connection(conn)
    except Error:
        return False
    return True


class CheckedPool(ConnectionPool):
    """psycopg's pool whose ``getconn`` hands out only usable connections.

    A connection ``connection_usable`` refuses is closed and given back (the
    pool discards it and opens another in the background), and the next one is
    taken at once: at most ``max_size`` + 1 tries, then whatever the pool gives
    (a new connection). Build it with ``check=None``: the check is here.
    """

    def getconn(self, timeout: float | None = None):
        for _ in range(self.max_size + 1):
            conn = super().getconn(timeout)
            if connection_usable(conn):
                return conn
            conn.close()
            self.putconn(conn)
        return super().getconn(timeout)


class AsyncConnections:
    """This process's ``AsyncConnection``s, for database work awaited in the event
    loop itself (``ballast.db.transaction_one_message_async``: the request path's
    one message), not in a worker thread.

    ``take()`` gives an idle connection that ``async_connection_usable`` accepts
    (one it refuses is closed and the next taken at once, as ``CheckedPool``
    does), else connects a new one with ``connect_kwargs()`` (called then, so a
    test database's name is seen) while fewer than ``max_open`` are open, else
    None: the caller goes the threaded way (Django's pool, which waits for a
    connection), so a burst never opens more than ``max_open`` here.
    ``give_back(conn)`` keeps it idle for the next caller, unless it is closed
    or not idle (a statement cancelled in flight, a transaction left open):
    then it is closed. At most one caller uses a connection at a time.

    Why not psycopg_pool's ``AsyncConnectionPool``: it belongs to the event loop
    that opened it (its worker tasks, its locks), while a connection here is
    used by whichever loop takes it: the coordinator has one loop, the test
    suite one per test, and a loop's pool would outlive it with its
    connections open (the test database could not be dropped). ``close_all()``
    closes the idle ones without a loop.
    """

    def __init__(self, connect_kwargs, max_open: int) -> None:
        self.connect_kwargs = connect_kwargs
        self.max_open = max_open
        self.opened = 0  # connections open: idle or taken
        self._idle: collections.deque[AsyncConnection] = collections.deque()

    async def take(self) -> AsyncConnection | None:
        """An idle usable connection, else a new one, else None (``max_open`` are
        taken). Raises psycopg's ``OperationalError`` when a new connection
        cannot be made."""
        while self._idle:
            conn = self._idle.pop()  # the most recent: its server process is warm
            if await async_connection_usable(conn):
                return conn
            self._close(conn)
        if self.opened >= self.max_open:
            return None
        self.opened += 1
        try:
            return await AsyncConnection.connect(**self.connect_kwargs())
        except BaseException:
            self.opened -= 1
            raise

    def give_back(self, conn: AsyncConnection) -> None:
        """Keep ``conn`` for the next ``take`` (or close it; see the class doc)."""
        if (
            not conn.closed
            and conn.info.transaction_status == pq.TransactionStatus.IDLE
        ):
            self._idle.append(conn)
        else:
            self._close(conn)

    def close_all(self) -> None:
        """Close every idle connection (no event loop needed)."""
        while self._idle:
            self._close(self._idle.pop())

    def _close(self, conn: AsyncConnection) -> None:
        self.opened -= 1
        _close_now(conn)


def _close_now(conn) -> None:
    """Close a psycopg connection at once, sync or async, with no loop: its
    libpq connection ends (a statement in flight is abandoned)."""
    if not conn.closed:
        conn.pgconn.finish()
