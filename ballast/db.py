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

from collections.abc import Callable

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connection
from django.db.models import Model
from django.db.models.expressions import DatabaseDefault


def db_call(func: Callable) -> Callable:
    """``func`` as a coroutine function running in a worker thread (see module doc)."""
    sqlite = settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
    return database_sync_to_async(func, thread_sensitive=sqlite)


_insert_sql: dict[tuple[str, tuple[str, ...]], str] = {}


def row_insert(obj: Model) -> None:
    """INSERT one model instance with a statement built once per model and columns.

    For the request path: ``Model.objects.create`` compiles its SQL through the ORM
    on every call (~1 ms of Python a statement on this project's machines); this
    prepares each field's value the same way (``get_db_prep_save`` after
    ``pre_save``, so defaults and ``auto_now_add`` apply) and sends a fixed
    statement. The primary key must be set beforehand (a UUID); no signals are
    sent. Raises the database's IntegrityError like ``create`` would.
    """
    meta = obj._meta
    fields, values = [], []
    for field in meta.concrete_fields:
        value = field.pre_save(obj, True)
        if isinstance(value, DatabaseDefault):
            continue  # the column's database default applies
        fields.append(field)
        values.append(field.get_db_prep_save(value, connection))
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
    obj._state.adding = False
    obj._state.db = connection.alias
