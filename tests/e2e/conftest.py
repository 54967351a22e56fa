"""Real processes for end-to-end tests, started the way the README does.

Each test gets its own database: a fresh SQLite file on the embedded default, or a
fresh PostgreSQL database when ``DATABASE_URL`` names PostgreSQL; Redis is used
when ``REDIS_URL`` is set. Children are stopped when the test ends.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from urllib.parse import urlparse, urlunparse

import psycopg
import pytest

from ballast.stack import Stack, last_line, manage


@pytest.fixture
def e2e_env(tmp_path) -> Iterator[dict[str, str]]:
    """The environment of the children, with a database of their own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["DJANGO_SETTINGS_MODULE"] = "ballast.settings"
    env.setdefault("BALLAST_DEV", "1")
    env["BALLAST_VAR_DIR"] = str(tmp_path / "var")
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
    yield env
    if dbname:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


@pytest.fixture
def stack(e2e_env, tmp_path) -> Iterator[Stack]:
    """A migrated, running coordinator (no agents yet)."""
    with Stack(env=e2e_env, log_dir=tmp_path / "logs") as running:
        running.migrate()
        running.start_coordinator()
        yield running


@pytest.fixture
def renter_key(stack) -> str:
    """A renter with 5 USD; its API key."""
    return last_line(
        manage(
            "renter_create", "e2e-renter@example.com", "--credit", "5", env=stack.env
        )
    )


@pytest.fixture
def machine(stack):
    """Register a machine; returns a function name -> token."""

    def make(name: str) -> str:
        return last_line(
            manage("machine_create", "e2e-host@example.com", name, env=stack.env)
        )

    return make
