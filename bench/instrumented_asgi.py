"""The coordinator's ASGI application with counters, for benchmarks only.

``uvicorn bench.instrumented_asgi:application`` serves ``ballast.asgi.application``
unchanged, but wraps the hot path's database functions (``COUNTED``: the services
the views and consumers call, in every module that binds them, of whichever
commit runs it) to count calls, wall time and SQL statements, and counts every
INSERT/UPDATE/DELETE by table. ``GET /bench/stats`` returns the counters as JSON; ``POST /bench/reset``
zeroes them. No product file is changed: the wrappers replace module attributes
at import time in this process only.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import threading
import time
from collections import defaultdict

from django.db import connections
from django.db.backends.signals import connection_created

from ballast.asgi import (
    application as ballast_application,  # noqa: E402 (sets up Django)
)
from bench.common import json_answer

_lock = threading.Lock()
_local = threading.local()
stats: dict = {
    "calls": defaultdict(lambda: [0, 0.0, 0]),
    "writes": defaultdict(int),
    "statements": 0,
    "heartbeats": 0,
    "last_heartbeat": 0.0,
}
WRITE = re.compile(r'^\s*(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+"?(\w+)"?', re.I)


def _count_sql(execute, sql, params, many, context):
    with _lock:
        stats["statements"] += 1
        m = WRITE.match(sql)
        if m:
            stats["writes"][m.group(2)] += 1
    depth = getattr(_local, "queries", None)
    if depth is not None:
        _local.queries += 1
    return execute(sql, params, many, context)


def _on_connection(sender, connection, **kwargs):
    if _count_sql not in connection.execute_wrappers:
        connection.execute_wrappers.append(_count_sql)


connection_created.connect(_on_connection)


# the functions counted, wherever a module binds them (the services, selectors and
# request steps of the commit under test: names one commit lacks are skipped)
COUNTED = (
    "_job_open",
    "job_open",
    "job_open_by_key",
    "job_open_by_key_async",
    "job_submit",
    "api_key_authenticate",
    "api_key_with_model",
    "credit_lock",
    "credit_available_nano",
    "job_dispatch",
    "device_claim",
    "attempt_claim",
    "attempt_end",
    "job_finish",
    "job_succeed",
    "job_lease_renew",
    "jobs_waiting_channels",
    "machine_heartbeat",
    "machine_hello",
    "machine_authenticate",
    "machine_disconnect",
    "machines_stale_mark",
    "lease_renew",
    "machines_spot_check_due",
)


def _wrapper(original, label: str):
    """``original`` counted under ``label``: calls, wall time, SQL statements
    (an async function: its wall time only, its statements where Django runs them)."""

    def record(start: float, outer) -> None:
        elapsed = time.perf_counter() - start
        with _lock:
            row = stats["calls"][label]
            row[0] += 1
            row[1] += elapsed
            row[2] += _local.queries or 0
        _local.queries = (outer + _local.queries) if outer is not None else None

    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                with _lock:
                    row = stats["calls"][label]
                    row[0] += 1
                    row[1] += time.perf_counter() - start

        return wrapper

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        outer = getattr(_local, "queries", None)
        _local.queries = 0
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            record(start, outer)

    return wrapper


def _install() -> None:
    import hosts.consumers
    import hosts.liveness
    import hosts.services
    import jobs.consumers
    import jobs.orchestration
    import jobs.services
    import jobs.views  # noqa: F401 (every module that binds a counted name, loaded)

    wrappers: dict[int, object] = {}
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".")[0] not in ("jobs", "hosts", "billing"):
            continue
        for name in COUNTED:
            original = vars(module).get(name)
            if not inspect.isfunction(original):
                continue
            if original.__module__.split(".")[0] not in ("jobs", "hosts", "billing"):
                continue
            if id(original) not in wrappers:
                label = (
                    name
                    if not name.startswith("_")
                    else (f"{original.__module__.rsplit('.', 1)[-1]}.{name}")
                )
                wrappers[id(original)] = _wrapper(original, label)
            setattr(module, name, wrappers[id(original)])

    original = hosts.consumers.HostConsumer.frame_heartbeat

    async def frame_heartbeat(self, frame):
        await original(self, frame)
        stats["heartbeats"] += 1
        stats["last_heartbeat"] = time.time()

    hosts.consumers.HostConsumer.frame_heartbeat = frame_heartbeat


_install()


async def application(scope, receive, send):
    if scope["type"] == "http" and scope["path"].startswith("/bench/"):
        if scope["path"] == "/bench/reset":
            with _lock:
                stats["calls"].clear()
                stats["writes"].clear()
                stats["statements"] = 0
                stats["heartbeats"] = 0
        await json_answer(
            send,
            {
                **stats,
                "calls": dict(stats["calls"]),
                "writes": dict(stats["writes"]),
                "connections": len(connections.all(initialized_only=True)),
            },
        )
        return
    await ballast_application(scope, receive, send)
