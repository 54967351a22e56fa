"""Real processes for end-to-end tests, started the way the README does.

Each test gets its own database: a fresh SQLite file on the embedded default, or a
fresh PostgreSQL database when ``DATABASE_URL`` names PostgreSQL; Redis is used
when ``REDIS_URL`` is set. Children are stopped when the test ends.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ballast.stack import Stack, last_line, manage

from .env import children_env


@pytest.fixture
def e2e_env(tmp_path) -> Iterator[dict[str, str]]:
    """The environment of the children, with a database of their own (``env.children_env``)."""
    with children_env(tmp_path / "var") as env:
        yield env


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


@pytest.fixture
def machine_of(stack):
    """Register a machine of a given owner; returns a function (owner email,
    name) -> token."""

    def make(owner: str, name: str) -> str:
        return last_line(manage("machine_create", owner, name, env=stack.env))

    return make
