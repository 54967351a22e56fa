"""``ballast.dbpool.connection_check``: the pool's check of a connection it hands out."""

from __future__ import annotations

import select

import psycopg
import pytest
from django.db import connection
from psycopg_pool import ConnectionPool

from ballast.dbpool import connection_check

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the pool runs on PostgreSQL only"
    ),
]


def _connect() -> psycopg.Connection:
    params = connection.get_connection_params()
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True)


@pytest.fixture
def asked(monkeypatch) -> list:
    """The connections the check asked with a round trip (the empty query)."""
    calls = []
    real = ConnectionPool.check_connection

    def spied(conn):
        calls.append(conn)
        real(conn)

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(spied))
    return calls


def _terminate(conn: psycopg.Connection) -> None:
    """End ``conn``'s session from another one and wait until its backend is gone."""
    pid = conn.info.backend_pid
    with _connect() as killer:
        assert killer.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
        while killer.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()[0]:
            killer.execute("SELECT pg_sleep(0.01)")


def test_a_healthy_connection_passes_without_a_round_trip(asked):
    with _connect() as conn:
        conn.execute("SELECT 1").fetchone()
        connection_check(conn)
        assert asked == []
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_a_session_the_server_ended_is_refused(asked):
    with _connect() as conn:
        _terminate(conn)
        with pytest.raises(psycopg.OperationalError):
            connection_check(conn)
        assert asked == [conn]  # the waiting FATAL message made it ask


def test_a_closed_connection_is_refused(asked):
    conn = _connect()
    conn.close()
    with pytest.raises(psycopg.OperationalError, match="closed"):
        connection_check(conn)
    assert asked == []


def test_a_harmless_message_waiting_is_consumed_and_passes(asked):
    with _connect() as conn, _connect() as other:
        conn.execute("LISTEN ballast_check")
        other.execute("NOTIFY ballast_check")
        # wait until the notification reaches the idle connection's socket
        assert select.select([conn.pgconn.socket], [], [], 10)[0]
        connection_check(conn)
        assert asked == [conn]
        assert conn.execute("SELECT 3").fetchone() == (3,)
