"""The database: SQLite by default, PostgreSQL when ``DATABASE_URL`` names
it (a bounded, checked psycopg pool per process, prepared statements)."""

from __future__ import annotations

import os

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from ballast.envvars import (
    env_int,
)

from .base import VAR_DIR

# --- database ---------------------------------------------------------------
# SQLite's options, whatever names the file (the embedded default or a
# DATABASE_URL): WAL lets the ASGI server, Celery and manage.py share the file;
# IMMEDIATE makes every transaction take the write lock up front, so the
# one-writer rule settles claims (DESIGN.md "Picking a device"); a writer waits
# up to 30 s for the lock instead of failing with "database is locked".
SQLITE_OPTIONS = {
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    "transaction_mode": "IMMEDIATE",
    "timeout": 30,
}
DATABASE_URL = os.environ.get("DATABASE_URL", "")
if DATABASE_URL:
    try:
        _db = dj_database_url.parse(DATABASE_URL, conn_max_age=0)
    except Exception as exc:  # dj_database_url raises several types
        raise ImproperlyConfigured(
            f"DATABASE_URL is not a database URL: {exc}"
        ) from exc
    if _db["ENGINE"] == "django.db.backends.postgresql":
        # A bounded psycopg pool per process: every request's thread borrows a
        # connection instead of opening one (and many processes stay under
        # max_connections). BALLAST_DB_POOL_MAX connections at most per process.
        _db.setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": env_int("BALLAST_DB_POOL_MAX", 8, minimum=1),
            "timeout": 30,
        }
        # Django's backend whose pool checks each connection as it hands it out
        # (``ballast.dbpool.CheckedPool``): one the server closed (a restart, a
        # killed session) is replaced at once instead of failing the request
        # that got it, and a healthy one costs no round trip (Django's
        # CONN_HEALTH_CHECKS sends an empty query every time, and its pool
        # sleeps 1 s, 2 s, … after each connection that fails the check)
        _db["ENGINE"] = "ballast.postgresql"
        # prepared statements: parameters bound by the server and a statement a
        # connection has run 5 times prepared, so PostgreSQL plans it once per
        # connection, not at every run (the dispatch's claim spent most of its
        # server time planning: docs/performance.md). Django turns them off by
        # default for external poolers (PgBouncer in transaction mode); this
        # pool is the process's own. Restart the coordinators after a migration
        # that changes a table's columns (docs/scaling.md).
        _db["OPTIONS"]["server_side_binding"] = True
        _db["OPTIONS"]["prepare_threshold"] = 5
    elif _db["ENGINE"] == "django.db.backends.sqlite3":
        _db["OPTIONS"] = {**SQLITE_OPTIONS, **_db.get("OPTIONS", {})}
else:
    _db = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("BALLAST_SQLITE_PATH", str(VAR_DIR / "ballast.sqlite3")),
        "OPTIONS": dict(SQLITE_OPTIONS),
    }
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # SQLite's connection is kept between calls (``ballast.db.db_call`` closes
    # old connections around each): opening one runs the PRAGMAs above and
    # registers Django's SQL functions, about 2 ms of the one database thread
    # per call, twice in each request's admission (docs/performance.md)
    _db["CONN_MAX_AGE"] = None
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

