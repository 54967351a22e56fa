"""Shared pieces of the benchmarks: the machine, a scratch PostgreSQL database, stats."""

from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import uuid
from contextlib import contextmanager
from urllib.parse import urlparse, urlunparse

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/postgres"

# a benchmark is one renter sending as fast as it can: the per-key limits of
# DESIGN.md "Limits and abuse" would measure the limiter, not the path; set here
# (inherited by every process a bench starts) unless the caller set them
LIMITS_LIFTED = {
    "BALLAST_KEY_RATE": "100000000/minute",
    "BALLAST_KEY_MAX_JOBS": "100000",
    "BALLAST_QUEUE_SHARE_MIN": "100000000",
    # thousands of simulated machines and renters' sockets from one address, a
    # machine's hello perhaps late behind thousands of others on the bench's cores
    "BALLAST_SOCKETS_PER_ADDRESS": "100000000",
    "BALLAST_SOCKETS_PER_KEY": "100000000",
    "BALLAST_HELLO_TIMEOUT_S": "600",
}
for _name, _value in LIMITS_LIFTED.items():
    os.environ.setdefault(_name, _value)


def sigterm_exits() -> None:
    """Make SIGTERM leave like Ctrl-C: ``SystemExit`` runs every ``finally`` and
    context exit (the bench's processes stopped, its scratch databases dropped,
    its worktree removed) where Python's default would end the process at once."""

    def leave(signum, frame) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)


def machine_line() -> str:
    """One line describing the machine: CPU model, cores, memory, Python."""
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, Python {platform.python_version()}"


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0..100) of ``values`` by nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def summary_ms(seconds: list[float]) -> str:
    """``p50 … ms  p99 … ms`` of durations given in seconds."""
    ms = [s * 1000 for s in seconds]
    return f"p50 {percentile(ms, 50):7.2f} ms  p99 {percentile(ms, 99):7.2f} ms  mean {statistics.fmean(ms):7.2f} ms"


@contextmanager
def scratch_postgres(base_url: str | None = None):
    """Create a fresh PostgreSQL database, yield its URL, drop it afterwards."""
    import psycopg

    base = urlparse(base_url or os.environ.get("BENCH_DATABASE_URL") or DEFAULT_PG)
    name = f"ballast_bench_{uuid.uuid4().hex[:8]}"
    admin = urlunparse(base._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunparse(base._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def django_on(url: str, **env: str) -> None:
    """Set Django up in this process on the database ``url`` and migrate it.

    No Redis (the in-memory channel layer), ``DJANGO_DEBUG=0`` (no query log), the
    per-key limits out of the way, and ``env`` as further settings (e.g. ``BALLAST_SPOT_CHECKS="0"``). For benches that
    call the services in-process on a ``scratch_postgres`` database.
    """
    os.environ["DATABASE_URL"] = url
    os.environ.pop("REDIS_URL", None)
    os.environ["DJANGO_DEBUG"] = "0"
    os.environ.setdefault("BALLAST_DEV", "1")
    # one renter's key makes every request of a run: past a key's default limits
    # (120/minute, 16 open jobs, the queue share) on purpose
    os.environ.setdefault("BALLAST_KEY_RATE", "1000000/minute")
    os.environ.setdefault("BALLAST_KEY_MAX_JOBS", "100000")
    os.environ.setdefault("BALLAST_QUEUE_SHARE_MIN", "1000000")
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ballast.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def chat_job_store(renter, model, content: str):
    """A streamed chat job of ``renter`` for ``model`` asking ``content``
    (``max_tokens`` 64), stored as the request path stores one
    (``jobs.services.job_create``); Django must be set up (``django_on``)."""
    from jobs.models import Job
    from jobs.services import job_create

    return job_create(
        renter=renter,
        api_key=None,
        model=model,
        endpoint=Job.Endpoint.CHAT,
        messages=[{"role": "user", "content": content}],
        prompt=None,
        params={"max_tokens": 64},
        placement={},
        stream=True,
    )


async def json_answer(send, payload) -> None:
    """Answer an ASGI HTTP request with ``payload`` as JSON (200): the bench
    applications' own endpoints (``/bench/stats``, ``/bench/timeline``)."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(payload).encode()})
