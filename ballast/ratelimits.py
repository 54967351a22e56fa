"""Rate limits (DESIGN.md "Limits and abuse"), from the ``limits`` library.

Counted in Redis (``REDIS_URL``) so every coordinator process shares them; the
embedded default (no ``REDIS_URL``) uses the library's in-memory storage (one
process). The moving-window strategy: a rate of ``10/minute`` allows 10 hits in
any 60 s. ``limits`` was chosen over django-ratelimit because its limiters work
outside a view (the renter websocket, ``jobs.services.requests.job_open`` in a
worker thread) on storages of its own, without a Django cache to configure.
"""

from __future__ import annotations

import functools
import math
import threading
import time

import limits
from django.conf import settings
from django.shortcuts import render
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


def rate_window_s(rate: str) -> int:
    """The window of ``rate`` (e.g. ``"60/hour"``: 3600), s: a hit older than
    it no longer counts."""
    return limits.parse(rate).get_expiry()


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


def limit_full(rate: str, scope: str, *identifiers: object) -> int | None:
    """Whether ``rate`` for ``scope`` and ``identifiers`` is used up, without
    counting a hit: None when another hit would be allowed, else the seconds
    (≥ 1) until one would (``limit_hit`` counts what is limited elsewhere)."""
    item = limits.parse(rate)
    names = [scope, *(str(i) for i in identifiers)]
    store = limiter()
    if store.test(item, *names):
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


def post_limited(rate_setting: str, scope: str, *, field: str | None = None):
    """Decorate a page view: a POST past the rate named by ``rate_setting`` (a
    setting such as ``BALLAST_LOGIN_RATE``), counted per client address and
    per account (the logged-in user, else the form's ``field`` lower-cased,
    e.g. the email a login or reset names), is answered ``429`` with
    ``Retry-After`` (s) and the page ``429.html``; the view does not run."""

    def decorate(view):
        @functools.wraps(view)
        def limited(request, *args, **kwargs):
            if request.method == "POST":
                wait = _post_wait(
                    request, getattr(settings, rate_setting), scope, field
                )
                if wait is not None:
                    response = render(
                        request, "429.html", {"retry_after": wait}, status=429
                    )
                    response["Retry-After"] = str(wait)
                    return response
            return view(request, *args, **kwargs)

        return limited

    return decorate


def _post_wait(request, rate: str, scope: str, field: str | None) -> int | None:
    checks = [(rate, f"{scope}.address", request.META.get("REMOTE_ADDR", ""))]
    if request.user.is_authenticated:
        checks.append((rate, f"{scope}.account", request.user.pk))
    elif field and (named := str(request.POST.get(field, "")).strip().lower()):
        checks.append((rate, f"{scope}.account", named))
    return limits_hit(checks)
