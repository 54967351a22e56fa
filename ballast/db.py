"""Running ORM work from async code.

``db_call(func)`` wraps a sync service like Channels' ``database_sync_to_async``
(old connections closed around each call). On PostgreSQL it runs on the shared
thread pool instead of the single thread that ``thread_sensitive=True`` gives every
consumer of a process, so one machine's heartbeat or claim never waits behind
another's database work; each service is its own transaction, so no call depends
on the thread of the one before. On SQLite (one writer) calls stay on that one
thread, where they would otherwise only contend for the file's lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import re
import uuid
import weakref
from collections.abc import Callable
from datetime import UTC, datetime

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections
from django.db.models import Choices, Model
from django.db.models.expressions import DatabaseDefault
from django.db.models.fields import NOT_PROVIDED
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from psycopg import pq

log = logging.getLogger("ballast.db")


def db_call(func: Callable) -> Callable:
    """``func`` as a coroutine function running in a worker thread (see module doc)."""
    sqlite = settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
    return database_sync_to_async(func, thread_sensitive=sqlite)


def db_call_retried(
    func: Callable,
    *,
    tries: int = 2,
    when: Callable[[DatabaseError], bool] | None = None,
) -> Callable:
    """``db_call(func)`` (keyword arguments), called up to ``tries`` times while
    it raises a DatabaseError that ``when(exc)`` accepts (any, by default);
    each failure before the last is logged. For work that is safe to repeat
    (the end of a job: one already closed is returned as it is, its charge is
    posted once by its key): a connection the server closed fails the call that
    used it and the next try gets another (the pool checks what it hands out);
    a transaction chosen as a deadlock's victim was rolled back whole
    (``lock_conflict``). Raises the last failure, or one ``when`` refuses."""
    call = db_call(func)

    async def retried(**kwargs):
        for tries_left in range(tries - 1, -1, -1):
            try:
                return await call(**kwargs)
            except DatabaseError as exc:
                if not tries_left or (when is not None and not when(exc)):
                    raise
                log.warning("%s failed (%s); once more", func.__name__, exc)
        raise AssertionError("tries must be at least 1")

    return retried


_insert_sql: dict[tuple[str, tuple[str, ...]], str] = {}


def row_values(obj: Model) -> tuple[list, list]:
    """(fields, values) of ``obj``'s INSERT, each value prepared as the ORM would.

    ``pre_save`` then ``get_db_prep_save`` (so defaults and ``auto_now_add``
    apply); fields whose value is a database default are left out (the column's
    default applies). Shared by ``row_insert`` and statements that insert a row
    inside a larger one (``jobs.services``' request step on PostgreSQL).
    """
    db = db_connection()
    fields, values = [], []
    for field in obj._meta.concrete_fields:
        value = field.pre_save(obj, True)
        if isinstance(value, DatabaseDefault):
            continue  # the column's database default applies
        fields.append(field)
        values.append(field.get_db_prep_save(value, db))
    return fields, values


def db_connection():
    """The default database's connection object itself, not Django's ``connection``
    proxy: every attribute read through the proxy looks the connection up again
    (an ``asgiref.local.Local``, ~2 µs), and preparing one row's values reads
    dozens (profiled: ~40 % of building the request statement)."""
    return connections[DEFAULT_DB_ALIAS]


def sql_value(value, params: list) -> str:
    """The SQL for one prepared value: a literal for NULL, booleans, 0, the
    empty string (a row's defaults) and a text choice of the code
    (``Attempt.Kind.FRESH``), else ``%s`` with ``value`` appended to ``params``.

    For the request path's long INSERT … SELECT statements: psycopg caches a
    statement's conversion only up to 50 parameters (and 4,096 characters), and
    a row's defaults are most of its columns.
    """
    if value is None:
        return "NULL"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int) and value == 0:  # also psycopg's Int4(0), …
        return "0"
    if type(value) is str and not value:
        return "''"
    if isinstance(value, Choices) and isinstance(value.value, str):
        return _literal(value.value)  # a code constant (Job.Status.QUEUED, …)
    params.append(value)
    return "%s"


def insert_leaves_out(field, value_sql: str) -> bool:
    """Whether an INSERT may leave ``field``'s column out when its value's SQL
    (``sql_value``) is ``value_sql``: a NULL, for a column with no database
    default (Django makes none unless the field has a ``db_default``), is
    what the column gets all the same. For the request path's long INSERT …
    SELECT statements, kept under psycopg's 4,096-character cache limit."""
    return value_sql == "NULL" and field.db_default is NOT_PROVIDED


def _literal(text: str) -> str:
    """``text`` as an SQL string literal (standard_conforming_strings: quotes
    doubled, backslashes literal). For code constants only, never input."""
    if "\x00" in text:
        raise ValueError("a NUL cannot be in an SQL literal")
    return "'" + text.replace("'", "''") + "'"


def row_saved(obj: Model) -> None:
    """Mark ``obj`` as a stored row of the default database (after a raw INSERT)."""
    obj._state.adding = False
    obj._state.db = connection.alias


def row_insert(obj: Model) -> None:
    """INSERT one model instance with a statement built once per model and columns.

    For the request path: ``Model.objects.create`` compiles its SQL through the ORM
    on every call (~1 ms of Python a statement on this project's machines); this
    prepares each field's value the same way (``row_values``) and sends a fixed
    statement. The primary key must be set beforehand (a UUID); no signals are
    sent. Raises the database's IntegrityError like ``create`` would.
    """
    meta = obj._meta
    fields, values = row_values(obj)
    key = (meta.label, tuple(f.column for f in fields))
    sql = _insert_sql.get(key)
    if sql is None:
        quote = connection.ops.quote_name
        sql = _insert_sql[key] = (
            f"INSERT INTO {quote(meta.db_table)}"
            f" ({', '.join(quote(f.column) for f in fields)})"
            f" VALUES ({', '.join(['%s'] * len(fields))})"
        )
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
    row_saved(obj)


# --- fixed statements through a plain cursor (the hot paths) ------------------------
# Raw SQL skips the ORM's compile (~1 ms of Python a statement here) but also its
# conversions: these turn parameters and values into what the ORM would give on
# both backends (PostgreSQL: native types; SQLite: text datetimes and UUIDs, 0/1).
def rows_fetch(sql: str, params: list, *, prepare: bool = False) -> list[tuple]:
    """Run ``sql`` (``%s`` placeholders, both backends) and return every row.

    ``prepare``: on PostgreSQL, run it as ``EXECUTE`` of the copy this
    connection prepared (``statement_execute``): for a fixed text run on every
    job, whose planning costs the server more than running it."""
    with statement_execute(sql, params, prepare) as cursor:
        return cursor.fetchall()


def row_fetch(sql: str, params: list, *, prepare: bool = False) -> tuple | None:
    """Run ``sql`` and return its first row, or None when it returns none
    (``prepare``: as ``rows_fetch``)."""
    with statement_execute(sql, params, prepare) as cursor:
        return cursor.fetchone()


def rows_changed(sql: str, params: list, *, prepare: bool = False) -> int:
    """Run a write ``sql`` and return how many rows it changed (``prepare``: as
    ``rows_fetch``)."""
    with statement_execute(sql, params, prepare) as cursor:
        return cursor.rowcount


@contextlib.contextmanager
def statement_execute(sql: str, params: list, prepare: bool = False):
    """A cursor of Django's connection that ran ``sql`` (``%s`` placeholders).

    With ``prepare``, on PostgreSQL: as ``EXECUTE`` of the statement this
    connection prepared (SQL ``PREPARE`` the first time it sends the text, one
    extra round trip; ``transaction_one_message``'s registry), the values as
    literals (Django's cursor binds them client-side), so the server plans the
    text once per connection (a generic plan), not on every call: the end of a
    job's statements took longer to plan than to run (docs/performance.md).
    A connection that lost its prepared statements prepares them again and the
    statement is sent once more, outside a transaction; inside one the error
    is raised (the transaction is aborted; the callers' ends are retried
    whole, ``db_call_retried``). Raises the database's error as Django's.
    """
    prepare = prepare and connection.vendor == "postgresql"
    for again in (True, False):
        query, values = sql, params
        if prepare:
            connection.ensure_connection()
            query, values = _prepared_for(
                connection.connection, [(sql, params, True)], transaction=False
            )
        with connection.cursor() as cursor:
            try:
                cursor.execute(query, values)
            except DatabaseError as exc:
                if (
                    prepare
                    and again
                    and _prepared_lost(connection.connection, exc)
                    and not connection.in_atomic_block
                ):
                    continue
                raise
            yield cursor
            return


def db_datetime(value):
    """A datetime parameter as the database takes it (None stays None)."""
    return connection.ops.adapt_datetimefield_value(value)


def db_uuid(value):
    """A UUID (or its string) as a parameter: native on PostgreSQL, hex on SQLite."""
    if value is None:
        return None
    if not isinstance(value, uuid.UUID):
        value = uuid.UUID(str(value))
    return value if connection.features.has_native_uuid_field else value.hex


def value_datetime(value) -> datetime | None:
    """A datetime read by a raw statement, aware (SQLite returns naive UTC text)."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        value = parse_datetime(value)
    if settings.USE_TZ and timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value


def value_uuid(value) -> uuid.UUID | None:
    """A UUID read by a raw statement (SQLite returns its 32 hex digits)."""
    if value is None or isinstance(value, uuid.UUID):
        return value
    return uuid.UUID(value)


def value_json(value):
    """A JSON column read by a raw statement (text on both backends here)."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value


# --- PostgreSQL: a whole transaction in one message -----------------------------------
# the statements each connection has prepared (SQL PREPARE), by connection; None
# when some were found gone (``_prepared_lost``): the names are then read again
# from the session before its next PREPARE (``_PREPARED_NAMES_SQL``)
_prepared_names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# this module's statements a session holds (PREPARE is not transactional: one
# prepared in a transaction that then failed is still there)
_PREPARED_NAMES_SQL = (
    "SELECT name FROM pg_prepared_statements WHERE left(name, 8) = 'ballast_'"
)
# at most this many per connection; past it a statement is sent planned afresh
PREPARED_PER_CONNECTION = 64


def transaction_one_message(statements: list[tuple[str, list, bool]]) -> list[list]:
    """PostgreSQL: ``BEGIN``, ``statements``, ``COMMIT`` as one query message.

    ``statements``: (sql with ``%s`` placeholders, params, prepare) each. The
    transaction goes to the server as one simple-protocol message, the
    parameters as literals (psycopg's client-side binding, ``ClientCursor``):
    one write, one wait for the answer, where psycopg's pipeline mode sends and
    polls once per statement (docs/performance.md). A statement marked
    ``prepare`` runs as ``EXECUTE`` of a statement the connection prepared
    (SQL ``PREPARE``, the first time this connection sends that text: one extra
    round trip), so the server plans it once per connection, not per call. The
    server runs the statements in order, each with its own snapshot (READ
    COMMITTED): a statement after a lock sees everything committed before the
    lock was granted. A connection that lost its prepared statements (a
    ``DEALLOCATE ALL`` or ``DISCARD ALL`` sent by anyone) prepares them again:
    the message, rolled back whole, is sent once more.

    Returns each statement's rows ([] for one that returns none). Needs
    Django's connection in autocommit (not inside ``atomic``). Raises the
    database's error as Django's (IntegrityError, …), after rolling the
    transaction back.
    """
    from psycopg import ClientCursor

    connection.ensure_connection()
    pg = connection.connection
    for again in (True, False):
        query, params = _prepared_for(pg, statements)
        cursor = connection._prepare_cursor(ClientCursor(pg))
        try:
            cursor.execute(query, params)
        except BaseException as exc:
            if not pg.closed and pg.info.transaction_status != 0:  # not IDLE
                with connection.wrap_database_errors:
                    pg.execute("ROLLBACK")
            if again and _prepared_lost(pg, exc):
                continue
            raise
        break
    rows = []
    raw = cursor.cursor
    for _ in statements:
        raw.nextset()  # past BEGIN, then each statement in turn
        rows.append(raw.fetchall() if _has_rows(raw) else [])
    return rows


def _has_rows(cursor) -> bool:
    """Whether ``cursor``'s current result is rows (a SELECT, a RETURNING),
    read off the result's status: psycopg makes ``description`` anew on every
    access, a column object each (profiled: ~12 % of the request step's Python)."""
    result = cursor.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


def execute_prepared(sql: str, params: list) -> list[tuple]:
    """Run one statement (``%s`` placeholders) as ``EXECUTE`` of the copy this
    connection prepared (``statement_execute``), inside the caller's
    transaction, if any; PostgreSQL only. Returns its rows ([] when it returns
    none).

    Not psycopg's own prepared statements (``prepare=True``): when psycopg
    holds any and sees a ``ROLLBACK``, it sends ``DEALLOCATE ALL``, which drops
    this module's too. Raises the database's error as Django's.
    """
    with statement_execute(sql, params, prepare=True) as cursor:
        return cursor.fetchall() if _has_rows(cursor.cursor) else []


def _prepared_for(pg, statements: list[tuple[str, list, bool]], transaction=True):
    """(query, params) of ``statements`` on psycopg connection ``pg``, after the
    PREPAREs it still needs (run here, Django's errors)."""
    with connection.wrap_database_errors:
        if _prepared_names.get(pg, ()) is None:  # some were lost: which are left?
            found = pg.execute(_PREPARED_NAMES_SQL, prepare=False).fetchall()
            _prepared_names[pg] = {row[0] for row in found}
        prepares, query, params = _message(pg, statements, transaction)
        for name, prepare_sql in prepares:
            pg.execute(prepare_sql)
            _prepared_names[pg].add(name)
    return query, params


def lock_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` (Django's or psycopg's error) is PostgreSQL ending a
    transaction for a lock conflict (a deadlock's victim, a serialization
    failure): nothing of it was kept, so it may be sent again."""
    from psycopg import errors

    return _psycopg_error(exc, errors.DeadlockDetected, errors.SerializationFailure)


def _prepared_lost(conn, exc: BaseException) -> bool:
    """Whether ``exc`` says a statement ``conn`` had prepared is gone (its
    session's prepared statements were dropped, by a ``DEALLOCATE ALL`` or
    ``DISCARD ALL`` of anyone's); the registry of ``conn`` is then marked
    unknown, so the next message reads which are left and prepares the rest
    (those prepared again in a transaction that failed since are still
    there)."""
    lost = _statement_lost(exc)
    if lost:
        _prepared_names[conn] = None
    return lost


def _statement_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is PostgreSQL's "prepared statement does not exist"."""
    from psycopg import errors

    return _psycopg_error(exc, errors.InvalidSqlStatementName)


def retry_worthy(exc: BaseException) -> bool:
    """Whether a transaction that failed with ``exc`` was rolled back whole for a
    reason that sending it again can get past: a lock conflict
    (``lock_conflict``) or a prepared statement its connection lost
    (``_prepared_lost``: prepared again on the next try). For
    ``db_call_retried``'s ``when``."""
    return lock_conflict(exc) or _statement_lost(exc)


def _psycopg_error(exc: BaseException, *kinds: type) -> bool:
    """Whether ``exc`` is one of psycopg's error ``kinds``, itself or as the
    cause of Django's error wrapping it."""
    return isinstance(exc, kinds) or isinstance(exc.__cause__, kinds)


async def transaction_one_message_async(
    statements: list[tuple[str, list, bool]],
) -> list[list]:
    """``transaction_one_message`` awaited in the event loop: the same message on
    one of this process's ``AsyncConnection``s (``async_connections``), so the
    caller's task waits for the answer without a worker thread (no hop to a
    thread and back, docs/performance.md); when all of those are taken (a
    burst), ``transaction_one_message`` in a worker thread (``db_call``). Same
    arguments, result and errors (psycopg's as Django's); needs no Django
    connection in the loop. A connection whose statement was cancelled in
    flight is closed, never reused.
    """
    from psycopg import AsyncClientCursor

    async with _async_connection() as conn:
        if conn is None:
            return await db_call(transaction_one_message)(statements)
        for again in (True, False):
            if _prepared_names.get(conn, ()) is None:  # some were lost: which are left?
                found = await (await conn.execute(_PREPARED_NAMES_SQL)).fetchall()
                _prepared_names[conn] = {row[0] for row in found}
            prepares, query, params = _message(conn, statements)
            for name, prepare_sql in prepares:
                await conn.execute(prepare_sql)
                _prepared_names[conn].add(name)
            cursor = AsyncClientCursor(conn)
            try:
                await cursor.execute(query, params)
            except Exception as exc:
                if not conn.closed and conn.info.transaction_status != 0:  # not IDLE
                    await conn.execute("ROLLBACK")
                if again and _prepared_lost(conn, exc):
                    continue
                raise
            break
        rows = []
        for _ in statements:
            cursor.nextset()  # past BEGIN, then each statement in turn
            rows.append(await cursor.fetchall() if _has_rows(cursor) else [])
        return rows


@contextlib.asynccontextmanager
async def _async_connection():
    """One of ``async_connections()`` for the block (None when all are taken),
    given back after it; psycopg's errors raised as Django's."""
    pool = async_connections()
    with connection.wrap_database_errors:
        conn = await pool.take()
    try:
        with connection.wrap_database_errors:
            yield conn
    finally:
        if conn is not None:
            pool.give_back(conn)


def _message(
    conn, statements: list[tuple[str, list, bool]], transaction: bool = True
) -> tuple[list, str, list]:
    """(the PREPAREs ``conn`` must run first as (name, sql), the message, its
    params) of ``transaction_one_message`` (``transaction``: between BEGIN and
    COMMIT); a name joins ``conn``'s prepared ones only once its PREPARE ran
    (the caller adds it)."""
    prepared = _prepared_names.setdefault(conn, set())
    prepares: list[tuple[str, str]] = []
    parts, params = (["BEGIN"] if transaction else []), []
    for sql, values, prepare in statements:
        name = _prepared_name(sql) if prepare else None
        if name is not None and name not in prepared:
            if len(prepared) + len(prepares) < PREPARED_PER_CONNECTION:
                prepares.append(
                    (name, f"PREPARE {name} AS {_dollar_placeholders(sql)}")
                )
            else:
                name = None
        if name is None:
            parts.append(sql)
        elif values:
            parts.append(f"EXECUTE {name}({', '.join(['%s'] * len(values))})")
        else:
            parts.append(f"EXECUTE {name}")
        params += values
    if transaction:
        parts.append("COMMIT")
    return prepares, "; ".join(parts), params


_async_connections = None


def async_connections():
    """This process's ``ballast.dbpool.AsyncConnections`` (made on first use), for
    Django's default PostgreSQL database: its connection parameters and time
    zone, in autocommit, with no cursor factory or automatic prepares of its
    own, at most ``BALLAST_DB_POOL_MAX`` open (as many again as Django's pool)."""
    global _async_connections
    if _async_connections is None:
        from ballast.dbpool import AsyncConnections

        def connect_kwargs() -> dict:
            django_connection = db_connection()
            kwargs = django_connection.get_connection_params()
            kwargs.pop("cursor_factory", None)
            kwargs.update(autocommit=True, prepare_threshold=None)
            # the session's time zone, as Django's connection setup sets it
            zone = f"-c TimeZone={django_connection.timezone_name}"
            kwargs["options"] = f"{kwargs.get('options', '')} {zone}".strip()
            return kwargs

        pool_options = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
        max_open = (
            pool_options.get("max_size", 8) if isinstance(pool_options, dict) else 8
        )
        _async_connections = AsyncConnections(connect_kwargs, max_open=max_open)
    return _async_connections


def async_connections_close() -> None:
    """Close this process's idle async connections and start afresh (the test
    harness, between tests: each test's event loop ends with it)."""
    global _async_connections
    if _async_connections is not None:
        _async_connections.close_all()
        _async_connections = None


def _prepared_name(sql: str) -> str:
    """The name a connection prepares ``sql`` under (the same text, the same name)."""
    return "ballast_" + hashlib.blake2b(sql.encode(), digest_size=10).hexdigest()


def _dollar_placeholders(sql: str) -> str:
    """``sql``'s ``%s`` placeholders as PREPARE's ``$1``, ``$2``, … (``%%`` → ``%``)."""
    numbers = itertools.count(1)
    return re.sub(
        r"%([%s])", lambda m: "%" if m[1] == "%" else f"${next(numbers)}", sql
    )
