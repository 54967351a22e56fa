"""The database pool's check of a connection it hands out.

``connection_check`` is the ``check`` of each process's psycopg pool (settings:
``DATABASES["default"]["OPTIONS"]["pool"]``). psycopg_pool's own check
(``ConnectionPool.check_connection``, what ``CONN_HEALTH_CHECKS`` turns on) sends
an empty query every time a connection is handed out: a round trip before every
database call of the request path (0.3–0.5 ms here, docs/performance.md). A
connection idle in the pool has nothing to read unless the server spoke first,
and a server that ends a session (a restart, ``pg_terminate_backend``, an idle
timeout) does: its FATAL message and the end of the stream. So only a connection
with something to read is asked.
"""

from __future__ import annotations

import select

from psycopg import OperationalError, pq
from psycopg_pool import ConnectionPool


def connection_check(conn) -> None:
    """Raise ``psycopg.OperationalError`` when ``conn`` (a psycopg connection idle
    in the pool) cannot be used; return quietly, without a round trip, when it can.

    Closed, or not in the OK state: refused. Something waiting on its socket
    (the server's message, or the end of the stream): the empty query of
    ``ConnectionPool.check_connection`` decides (it consumes a harmless
    notice; a session the server ended fails it). The pool replaces a refused
    connection with another, so the request that asked never sees it.
    """
    if conn.closed or conn.pgconn.status != pq.ConnStatus.OK:
        raise OperationalError("the pooled connection is closed")
    readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    if readable:
        ConnectionPool.check_connection(conn)
