"""``ballast.dbpool``: the pool hands out usable connections, checks healthy ones
without a round trip and replaces dead ones at once (no backoff sleep)."""

from __future__ import annotations

import os
import resource
import select

import psycopg
import pytest
from django.db import connection
from psycopg_pool import ConnectionPool

from ballast.dbpool import CheckedPool, connection_usable

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the pool runs on PostgreSQL only"
    ),
]


def _params() -> dict:
    params = connection.get_connection_params()
    params.pop("context", None)
    return params


def _connect() -> psycopg.Connection:
    return psycopg.connect(**_params(), autocommit=True)


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


def _terminate(*conns: psycopg.Connection) -> None:
    """End the sessions of ``conns`` from another one; wait until their backends are gone."""
    pids = [conn.info.backend_pid for conn in conns]
    with _connect() as killer:
        killer.execute(
            "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", [pids]
        )
        while killer.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]
        ).fetchone()[0]:
            killer.execute("SELECT pg_sleep(0.01)")


def test_a_healthy_connection_is_usable_without_a_round_trip(asked):
    with _connect() as conn:
        conn.execute("SELECT 1").fetchone()
        assert connection_usable(conn)
        assert asked == []
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_a_session_the_server_ended_is_not_usable(asked):
    with _connect() as conn:
        _terminate(conn)
        assert not connection_usable(conn)
        assert asked == [conn]  # the waiting FATAL message made it ask


def test_a_closed_connection_is_not_usable(asked):
    conn = _connect()
    conn.close()
    assert not connection_usable(conn)
    assert asked == []


def test_a_harmless_message_waiting_is_consumed_and_usable(asked):
    with _connect() as conn, _connect() as other:
        conn.execute("LISTEN ballast_check")
        other.execute("NOTIFY ballast_check")
        # wait until the notification reaches the idle connection's socket
        assert select.select([conn.pgconn.socket], [], [], 10)[0]
        assert connection_usable(conn)
        assert asked == [conn]
        assert conn.execute("SELECT 3").fetchone() == (3,)


def test_a_connection_on_a_descriptor_past_1023_is_checked():
    """``select()`` refuses descriptors past 1023; a busy coordinator has them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        if hard != resource.RLIM_INFINITY and hard < 1200:
            pytest.skip(f"at most {hard} open files here")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        with _connect() as conn:
            assert conn.pgconn.socket > 1023
            assert connection_usable(conn)
            _terminate(conn)
            assert not connection_usable(conn)
    finally:
        for fd in held:
            os.close(fd)


def test_dead_connections_are_replaced_at_once_without_a_backoff_sleep(monkeypatch):
    """After the server ended every session of the pool, the next ``getconn``
    returns a working connection: no sleep of psycopg_pool's backoff, no timeout."""
    from psycopg_pool import pool as pool_module

    def no_backoff(delay):
        raise AssertionError(f"the pool slept {delay} s before the next try")

    monkeypatch.setattr(pool_module, "sleep", no_backoff)
    with CheckedPool(
        kwargs={**_params(), "autocommit": True},
        min_size=3,
        max_size=3,
        check=None,
        timeout=30,
    ) as pool:
        pool.wait()
        conns = [pool.getconn() for _ in range(3)]
        _terminate(*conns)
        for conn in conns:
            pool.putconn(conn)  # back in the pool, idle, their sessions gone
        conn = pool.getconn()
        try:
            assert conn.execute("SELECT 4").fetchone() == (4,)
        finally:
            pool.putconn(conn)
