"""``bench/ratios.py``'s servers: the bare relay and Ballast on one stack, each
started fresh, yielding what the measurements need.

* ``bare_side``: ``bench/bare_relay.py`` under uvicorn (the coordinator's flags);
* ``ballast_side``: the coordinator (``ballast.asgi``, not instrumented) on
  ``pg`` (PostgreSQL + Redis: ``--database-url``'s database dropped and made
  again, ``--redis-url``'s db flushed; the channel layer and the limits in
  Redis, as production runs) or ``embedded`` (the default with no env vars:
  SQLite in a fresh var dir, Channels' in-memory layer), migrated, with 50
  machines and a renter with credit.

Both yield a ``Side``: base URL, renter key, the server's pid, machine tokens.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx

from ballast.stack import UVICORN_FLAGS, Stack, manage, port_free
from bench.harness import ROOT, coordinator_env, coordinator_start, redis_flush, renter_key

MACHINES = 50


@dataclass
class Side:
    name: str
    base: str
    key: str
    pid: int
    tokens: list[str]


def wait_http(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(url)


@contextmanager
def bare_side(tmp: str) -> Iterator[Side]:
    """The bare relay on a free port (no Django, no database)."""
    port = port_free()
    log = open(Path(tmp) / "bare.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "bench.bare_relay:app", "--host", "127.0.0.1",
         "--port", str(port), *UVICORN_FLAGS],
        cwd=ROOT, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/")
        yield Side("bare", base, "x", proc.pid, [f"t{i}" for i in range(MACHINES)])
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def database_fresh(url: str) -> None:
    """Drop and make again the PostgreSQL database of ``url`` (a fresh start per side)."""
    import psycopg

    name = urlparse(url).path.lstrip("/")
    admin = urlunparse(urlparse(url)._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def stack_env(stack: str, tmp: str, *, database_url: str, redis_url: str) -> dict[str, str]:
    """A coordinator's environment on ``stack`` (``pg`` or ``embedded``), its var dir fresh."""
    var = Path(tmp) / f"var-{stack}-{time.monotonic_ns()}"
    var.mkdir()
    if stack == "pg":
        database_fresh(database_url)
        redis_flush(redis_url)
        return coordinator_env(database_url, "pubsub", str(var), REDIS_URL=redis_url)
    if stack != "embedded":
        raise SystemExit(f"--stacks: {stack!r} is neither pg nor embedded")
    env = coordinator_env("", "inmem", str(var))
    env.pop("DATABASE_URL")  # the default: SQLite in the var dir
    return env


def machines_make(env: dict[str, str], count: int) -> list[str]:
    """Register ``count`` machines of one owner through ``hosts.services``; their tokens."""
    code = (
        "from hosts.services import machine_create\n"
        f"for i in range({count}):\n"
        "    print(machine_create(owner_email='host@bench.example', name=f'bench-{i}')[1])\n"
    )
    return manage("shell", "-c", code, env=env).split()[-count:]


@contextmanager
def ballast_side(stack: str, tmp: str, *, database_url: str, redis_url: str,
                 app: str = "") -> Iterator[Side]:
    """Ballast's coordinator on ``stack``, migrated, machines registered, a renter's key;
    ``app``: another ASGI application than ``ballast.asgi``'s (``bench.timeline_asgi``)."""
    env = stack_env(stack, tmp, database_url=database_url, redis_url=redis_url)
    with Stack(env=env, log_dir=Path(tmp) / f"logs-{stack}-{time.monotonic_ns()}") as running:
        # DEBUG off serves the collected files only: a page naming one not collected fails
        manage("collectstatic", "--noinput", "-v0", env=env)
        running.migrate()
        key = renter_key(env)
        tokens = machines_make(env, MACHINES)
        if app:
            coordinator_start(running, app=app)
        else:
            running.start_coordinator()
        yield Side(stack, running.url, key, running.processes["coordinator"].pid, tokens)
