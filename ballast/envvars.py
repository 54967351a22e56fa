"""The readers of Ballast's environment variables, and the checks of their
combinations, for ``ballast.settings`` (PROTOCOL.md §4).

Each reader returns the value of one variable (or its default when it is unset or
empty) and raises ImproperlyConfigured naming the variable on a bad value, so a
process refuses to start rather than run on a setting it misread.
"""

from __future__ import annotations

import os
import re
from decimal import Decimal, InvalidOperation
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    """Return the integer in environment variable ``name`` or ``default``.

    Raises ImproperlyConfigured naming the variable when the value is not an integer
    or is below ``minimum``.
    """
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    return value


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    """Return the number (e.g. seconds) in ``name`` or ``default``.

    Raises ImproperlyConfigured naming the variable on a non-number or one below
    ``minimum``.
    """
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    if value < minimum or value != value:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {raw!r}")
    return value


def env_decimal(name: str, default: str) -> Decimal:
    """Return the decimal fraction in ``name`` (0..1) or ``default``.

    Raises ImproperlyConfigured naming the variable when it is not in 0..1.
    """
    raw = os.environ.get(name) or default
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise ImproperlyConfigured(f"{name} must be a decimal, got {raw!r}") from None
    if not (Decimal(0) <= value <= Decimal(1)):
        raise ImproperlyConfigured(f"{name} must be between 0 and 1, got {raw!r}")
    return value


def env_usd(name: str, default: str) -> Decimal:
    """Return the USD amount in ``name`` (≥ 0, at most 9 decimals: the ledger's
    nano-USD) or ``default``. Raises ImproperlyConfigured naming the variable."""
    raw = os.environ.get(name) or default
    try:
        value = Decimal(raw)
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite() or value < 0 or value != round(value, 9):
        raise ImproperlyConfigured(
            f"{name} must be a USD amount like 1.00 (at least 0), got {raw!r}"
        )
    return value


def env_bool(name: str, default: bool) -> bool:
    """Return the boolean in ``name`` (1/0, true/false, yes/no) or ``default``."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    low = raw.strip().lower()
    if low in {"1", "true", "yes", "on"}:
        return True
    if low in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be 1 or 0, got {raw!r}")


def env_required(name: str, development_default: str, *, development: bool) -> str:
    """The value of ``name``; in development mode (``development``: the settings'
    ``BALLAST_DEV``) ``development_default`` when it is unset. Raises
    ImproperlyConfigured naming the variable when it is unset or empty outside
    development: production fails closed."""
    raw = os.environ.get(name, "").strip()
    if raw:
        return raw
    if development:
        return development_default
    raise ImproperlyConfigured(
        f"{name} must be set (or BALLAST_DEV=1 for a developer's machine)"
    )


def env_url(name: str, default: str) -> str:
    """The http(s) base URL in ``name`` (or ``default``), without a trailing
    slash: ``https://ballast.example.com``. Raises ImproperlyConfigured naming
    the variable for anything else (no scheme, another scheme, no host, a
    query)."""
    raw = os.environ.get(name, "").strip() or default
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
        raise ImproperlyConfigured(
            f"{name} must be the site's http(s) address, e.g."
            f" https://ballast.example.com, got {raw!r}"
        )
    return raw.rstrip("/")


def env_proxy_ssl_header(name: str) -> tuple[str, str] | None:
    """``HEADER=VALUE`` in ``name`` (e.g. ``X-Forwarded-Proto=https``: the header
    the load balancer sets on requests that came over HTTPS) as Django's
    ``SECURE_PROXY_SSL_HEADER`` pair (``("HTTP_X_FORWARDED_PROTO", "https")``), or
    None when unset. Raises ImproperlyConfigured naming the variable on another
    shape."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    header, sep, value = raw.partition("=")
    header, value = header.strip(), value.strip()
    if not sep or not header or not value or " " in header:
        raise ImproperlyConfigured(
            f"{name} must be HEADER=VALUE (e.g. X-Forwarded-Proto=https), got {raw!r}"
        )
    return "HTTP_" + header.upper().replace("-", "_"), value


def env_codes(name: str) -> tuple[str, ...]:
    """Return the comma-separated lower-case codes in ``name`` (empty: none given).

    Raises ImproperlyConfigured naming the variable for a code that is not 1–32
    of a-z, 0-9 and '-' (starting with a letter or digit).
    """
    codes = tuple(
        c.strip().lower() for c in os.environ.get(name, "").split(",") if c.strip()
    )
    for code in codes:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,31}", code):
            raise ImproperlyConfigured(
                f"{name} must list codes like eu,us-east; got {code!r}"
            )
    return codes


def env_rate(name: str, default: str) -> str:
    """A rate like ``60/minute`` or ``5/hour`` (the ``limits`` library's notation).

    Raises ImproperlyConfigured naming the variable when it is not one.
    """
    import limits

    raw = os.environ.get(name, default).strip()
    try:
        limits.parse(raw)
    except ValueError:
        raise ImproperlyConfigured(
            f"{name} must be a rate like '60/minute', got {raw!r}"
        ) from None
    return raw


def liveness_settings_check(
    *,
    max_age_s: float,
    interval_s: float,
    lease_s: float,
    renew_s: float,
    margin_s: float,
) -> None:
    """Refuse liveness settings under which live machines would not stay live.

    A machine silent for ``max_age − lease − margin`` s is marked stale at the
    lease loop's next tick (``hosts.liveness.stale_after_s``), and a heartbeat
    un-marks it only while it is younger than that: so it must be longer than
    the heartbeat interval, or a steady machine is marked stale between its
    heartbeats (at 0 s, as with max age 5 and the default lease, never
    un-marked: no device eligible). The lease must be renewed before it runs out
    (``renew < lease``). Raises ImproperlyConfigured naming the variables.
    """
    if max_age_s - lease_s - margin_s <= interval_s:
        raise ImproperlyConfigured(
            "BALLAST_HEARTBEAT_MAX_AGE_S − BALLAST_LEASE_S − BALLAST_LEASE_MARGIN_S"
            f" ({max_age_s:g} − {lease_s:g} − {margin_s:g}) must be more than"
            f" BALLAST_HEARTBEAT_INTERVAL_S ({interval_s:g}): machines would be"
            " marked stale between heartbeats"
        )
    if renew_s >= lease_s:
        raise ImproperlyConfigured(
            f"BALLAST_LEASE_RENEW_S ({renew_s:g}) must be less than BALLAST_LEASE_S"
            f" ({lease_s:g}): the lease would lapse between renewals"
        )
