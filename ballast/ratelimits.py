"""Rate limits (DESIGN.md "Limits and abuse"), from the ``limits`` library.

Counted in Redis (``REDIS_URL``) so every coordinator process shares them; the
embedded default (no ``REDIS_URL``) uses the library's in-memory storage (one
process). The moving-window strategy: a rate of ``10/minute`` allows 10 hits in
any 60 s. ``limits`` was chosen over django-ratelimit because its limiters work
outside a view (the renter websocket, ``jobs.services.requests.job_open`` in a
worker thread) on storages of its own, without a Django cache to configure.
"""

from __future__ import annotations

import math
import threading
import time

import limits
from django.conf import settings
from limits import storage, strategies

_lock = threading.Lock()
_limiter: tuple[str, strategies.RateLimiter] | None = None


def limiter() -> strategies.RateLimiter:
    """The process's limiter, on Redis when ``REDIS_URL`` is set (made once per URL)."""
    global _limiter
    url = settings.REDIS_URL
    with _lock:
        if _limiter is None or _limiter[0] != url:
            store = storage.storage_from_string(url) if url else storage.MemoryStorage()
            _limiter = (url, strategies.MovingWindowRateLimiter(store))
        return _limiter[1]


def limits_reset() -> None:
    """Forget every count (tests; an operator lifting a block)."""
    limiter().storage.reset()


def limit_hit(rate: str, scope: str, *identifiers: object) -> int | None:
    """Count one hit of ``rate`` (e.g. ``"60/minute"``) for ``scope`` and
    ``identifiers`` (a key id, an address, an email); None when it is allowed,
    else the seconds (≥ 1) until a hit would be allowed again (for
    ``Retry-After``). A refused hit is not counted."""
    item = limits.parse(rate)
    names = [scope, *(str(i) for i in identifiers)]
    store = limiter()
    if store.hit(item, *names):
        return None
    reset_at, _ = store.get_window_stats(item, *names)
    return max(1, math.ceil(reset_at - time.time()))


def limits_hit(checks: list[tuple[str, str, object]]) -> int | None:
    """``limit_hit`` for each (rate, scope, identifier) in order, stopping at the
    first refused; None when all allowed, else its seconds to wait."""
    for rate, scope, identifier in checks:
        wait = limit_hit(rate, scope, identifier)
        if wait is not None:
            return wait
    return None
