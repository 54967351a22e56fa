"""The database pool: connections the server closed are replaced at once.

Each process's psycopg pool (settings: ``DATABASES["default"]["OPTIONS"]["pool"]``,
built by the backend ``ballast.postgresql``) is a ``CheckedPool``. psycopg_pool's
own check (``ConnectionPool.check_connection``, what Django's
``CONN_HEALTH_CHECKS`` turns on) sends an empty query every time a connection is
handed out: a round trip before every database call of the request path; and after a failed check the pool sleeps with backoff
(1 s, 2 s, 4 s …) before it tries the next connection, so after a database
restart every request waited seconds, up to the pool's timeout.

A connection idle in the pool has nothing to read unless the server spoke first,
and a server that ends a session (a restart, ``pg_terminate_backend``, an idle
timeout) does: its FATAL message and the end of the stream. So only a connection
with something to read is asked, and one that fails is closed and replaced at
once, without sleeping.
"""

from __future__ import annotations

import select

from psycopg import Error, pq
from psycopg_pool import ConnectionPool


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
