"""The coordinator's ASGI application with a timeline of each renter request's
steps, for benchmarks only (``bench/admission_timeline.py``).

``uvicorn bench.timeline_asgi:application`` serves ``ballast.asgi.application``
unchanged but marks (``time.perf_counter``) each step of the one request in
flight: meant for sequential requests, one at a time. ``GET /bench/timeline``
returns every finished request's marks, in ms from the request's arrival, and
forgets them. No product file is changed: the marks wrap module attributes in
this process only.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time

from ballast.asgi import application as ballast_application  # sets up Django
from bench.common import json_answer

_current: list[tuple[str, float]] | None = None
_done: list[list[tuple[str, float]]] = []
_lock = threading.Lock()


def mark(name: str) -> None:
    """Note ``name`` now in the request in flight (first time only per name)."""
    current = _current
    if current is not None and all(n != name for n, _ in current):
        with _lock:
            current.append((name, time.perf_counter()))


def _around(owner, attr: str, before: str, after: str | None = None) -> None:
    original = getattr(owner, attr)
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def wrapper(*args, **kwargs):
            mark(before)
            try:
                return await original(*args, **kwargs)
            finally:
                if after:
                    mark(after)

    else:

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            mark(before)
            try:
                return original(*args, **kwargs)
            finally:
                if after:
                    mark(after)

    setattr(owner, attr, wrapper)


_thread = threading.local()


def _sql(execute, sql, params, many, context):
    """In the request's transaction (``_job_open``'s thread), mark each
    statement's end, named by its order and its first words; count the others
    (another job's work in another thread) as ``other statements``."""
    number = getattr(_thread, "statements", None)
    if number is None:
        global _others
        _others += 1
        try:
            return execute(sql, params, many, context)
        finally:
            if _in_transaction:
                mark(f"other: {' '.join(sql.split()[:4])[:32]}")
    _thread.statements = number + 1
    try:
        return execute(sql, params, many, context)
    finally:
        mark(f"sql {number + 1}: {' '.join(sql.split()[:4])[:32]}")


_others = 0
_in_transaction = False


def _statements_counted(original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        global _in_transaction
        _thread.statements, _in_transaction = 0, True
        try:
            return original(*args, **kwargs)
        finally:
            _thread.statements, _in_transaction = None, False

    return wrapper


def _on_connection(sender, connection, **kwargs):
    if _sql not in connection.execute_wrappers:
        connection.execute_wrappers.append(_sql)


def _install() -> None:
    from django.db.backends.signals import connection_created

    import ballast.ratelimits as ratelimits
    import jobs.consumers.host as host
    import jobs.services.dispatch as dispatch
    import jobs.services.requests as requests
    import jobs.views as views
    from jobs.orchestration import run

    connection_created.connect(_on_connection)
    _around(ratelimits, "limit_hit", "limit_hit", "limit_hit done")
    _around(ratelimits, "limit_full", "limit_full", "limit_full done")
    _around(requests, "key_rate_check", "key_rate_check")
    _around(requests, "api_key_mark_used", "mark used", "marked used")
    _around(requests, "request_model", "model", "model judged")
    _around(requests, "request_fits", "fits", "fitted")
    _around(requests, "credit_lock", "credit lock", "credit locked")
    _around(requests, "jobs_open_of", "open jobs", "open jobs read")
    _around(requests, "job_build", "build", "built")
    _around(requests, "job_dispatch", "dispatch", "dispatched")
    _around(views, "_completion_answer", "view")
    _around(views, "job_channel_open", "channel+txn", "back on loop")
    views._job_open = _statements_counted(views._job_open)
    _around(views, "_job_open", "thread", "thread done")
    _around(requests, "job_submit", "key checked", "submitted")
    _around(dispatch, "device_claim", "claim", "claimed")
    _around(dispatch, "device_pick_sql", "pick sql", "pick sql built")
    _around(dispatch, "_job_insert_sql", "job insert sql", "job insert sql built")
    _around(dispatch, "update_then", "update_then", "update_then done")
    _around(run.local, "channel_send", "channel_send")
    _around(host.HostRelayConsumer, "attempt_offer", "offer to host", "offer sent")
    _around(host.HostRelayConsumer, "frame_claim", "claim frame")
    _around(host.HostRelayConsumer, "frame_token", "token frame")
    _around(run.JobRun, "_follow", "follow")


_install()


async def application(scope, receive, send):
    global _current, _others
    if scope["type"] == "http" and scope["path"] == "/bench/timeline":
        with _lock:
            timelines = list(_done)
            _done.clear()
        await json_answer(send, timelines)
        return
    if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
        await ballast_application(scope, receive, send)
        return
    start = time.perf_counter()
    mine = _current = [("arrived", start)]
    _others = 0

    async def marked_send(message):
        if message["type"] == "http.response.start":
            mark("response start")
        elif message.get("body") and b"content" in message["body"]:
            mark("first token sent")
        await send(message)

    try:
        await ballast_application(scope, receive, marked_send)
    finally:
        if _current is mine:  # (the next request may have begun: its own)
            mark(f"(other statements meanwhile: {_others})")
            _current = None
        with _lock:
            _done.append([(n, round((t - start) * 1000, 3)) for n, t in mine])
