"""The environment of real child processes (coordinator, Celery, agents) with a
database of their own: a fresh SQLite file under ``var_dir`` on the embedded
default, or a fresh PostgreSQL database when ``DATABASE_URL`` names PostgreSQL
(dropped at the end); Redis is used when ``REDIS_URL`` is set."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import psycopg


@contextmanager
def children_env(var_dir: Path) -> Iterator[dict[str, str]]:
    """The children's environment (see the module); the caller may add to it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["DJANGO_SETTINGS_MODULE"] = "ballast.settings"
    env.setdefault("BALLAST_DEV", "1")
    env["BALLAST_VAR_DIR"] = str(var_dir)
    env.setdefault("BALLAST_HEARTBEAT_INTERVAL_S", "1")
    # one renter's key sends the load tests' hundreds of requests at once: past a
    # key's default limits on purpose (the limits are tests/jobs/test_limits.py's)
    env.setdefault("BALLAST_KEY_MAX_JOBS", "1000")
    env.setdefault("BALLAST_KEY_RATE", "100000/minute")
    env.setdefault("BALLAST_QUEUE_SHARE_MIN", "1000000")  # one renter may queue all
    database_url = os.environ.get("DATABASE_URL", "")
    dbname = None
    if database_url.startswith(("postgres://", "postgresql://")):
        parsed = urlparse(database_url)
        dbname = f"ballast_e2e_{uuid.uuid4().hex[:8]}"
        admin = urlunparse(parsed._replace(path="/postgres"))
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')
        env["DATABASE_URL"] = urlunparse(parsed._replace(path=f"/{dbname}"))
    try:
        yield env
    finally:
        if dbname:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def children_rows(env: dict[str, str], query: str) -> list[tuple]:
    """The rows ``query`` (SQL both databases read alike) returns from the
    children's database (``children_env``'s PostgreSQL or SQLite file)."""
    url = env.get("DATABASE_URL")
    if url:
        with psycopg.connect(url) as conn:
            return conn.execute(query).fetchall()
    import sqlite3

    with sqlite3.connect(f"{env['BALLAST_VAR_DIR']}/ballast.sqlite3") as conn:
        return list(conn.execute(query))
