"""Fixed statements built from a model's fields: the writes every job makes,
sent without the ORM compiling a query at every call (issue 34), the same SQL
text on PostgreSQL and SQLite; where they differ (no writes inside ``WITH`` on
SQLite), how the statement is sent differs, never what it says
(CONVENTIONS.md "Speed without a second path"). ``ballast.rows`` is the
reading side.
"""

from __future__ import annotations

from django.db import connection, transaction

from .db import on_postgresql


def update_then(
    claim: tuple[str, list], columns: tuple[str, ...], steps: list[tuple[str, list]]
) -> tuple | None:
    """Run ``claim`` (an ``UPDATE … RETURNING`` of ``columns``, at most one row)
    and then each of ``steps`` (``(sql, params)``: writes that read the claimed
    row as the table ``claimed``, empty when none was), in the caller's
    transaction if any; return the claimed row (a tuple in ``columns``' order) or None.

    PostgreSQL: one statement, one round trip (``WITH claimed AS (claim), …
    SELECT … FROM claimed``: the steps are data-modifying sub-statements);
    SQLite (no writes inside WITH): the claim, then each step after
    ``WITH claimed(columns) AS (VALUES (the row))``, in one transaction. The
    same SQL texts either way: only how they are sent differs. Atomic whether
    or not the caller holds a transaction.
    """
    claim_sql, claim_params = claim
    names = ", ".join(connection.ops.quote_name(c) for c in columns)
    if on_postgresql():
        parts = [f"claimed AS ({claim_sql})"]
        params = list(claim_params)
        for number, (sql, step_params) in enumerate(steps):
            parts.append(f"step{number} AS ({sql})")
            params += step_params
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH {', '.join(parts)} SELECT {names} FROM claimed", params
            )
            return cursor.fetchone()
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        cursor.execute(claim_sql, claim_params)
        row = cursor.fetchone()
        for sql, step_params in steps:
            cursor.execute(*_after_claimed(columns, row, sql, step_params))
        return row


def write_then_read(
    write: tuple[str, list], columns: tuple[str, ...], read: tuple[str, list]
) -> list[tuple]:
    """Run ``write`` (an ``INSERT`` or ``UPDATE … RETURNING`` of ``columns``, at
    most one row) and then ``read`` (a SELECT that reads the written row as
    the table ``claimed``); return ``read``'s rows. ``read`` must leave the
    written row out where it reads its table (by its id): on PostgreSQL it is
    one statement (``WITH claimed AS (write) read``), whose tables do not show
    the row yet; on SQLite (no writes inside WITH) the write, then ``read``
    after ``WITH claimed(columns) AS (VALUES (the row))``, whose tables do.
    The same SQL texts either way, as ``update_then``'s; atomic."""
    write_sql, write_params = write
    if on_postgresql():
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH claimed AS ({write_sql}) {read[0]}", [*write_params, *read[1]]
            )
            return cursor.fetchall()
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        cursor.execute(write_sql, write_params)
        row = cursor.fetchone()
        cursor.execute(*_after_claimed(columns, row, *read))
        return cursor.fetchall()


def _after_claimed(
    columns: tuple[str, ...], row: tuple | None, sql: str, params: list
) -> tuple[str, list]:
    """SQLite's ``sql`` (with ``params``) run after a claim that returned
    ``row`` (or None) of ``columns``: prefixed by ``WITH claimed(columns) AS
    (VALUES (row))``, an empty ``claimed`` for None."""
    names = ", ".join(connection.ops.quote_name(c) for c in columns)
    marks = ", ".join(["%s"] * len(columns))
    rows = f"VALUES ({marks})" if row else f"SELECT {marks} WHERE 0"
    values = list(row) if row else [None] * len(columns)
    return f"WITH claimed({names}) AS ({rows}) {sql}", [*values, *params]


def insert_sql(obj, *, exprs: dict[str, tuple[str, list]] | None = None) -> tuple:
    """``(sql, params)`` of ``INSERT INTO <obj's table> (<every column>) SELECT
    <its values>``: the unsaved model instance ``obj`` stored as
    ``obj.save(force_insert=True)`` stores it (each field's ``pre_save`` run,
    so ``auto_now_add`` fields are set on ``obj``; values adapted by the
    ORM), but in one statement the caller may extend (`` FROM …``) or send
    inside another (``update_then``). ``exprs``: attname → ``(SQL expression,
    its params)`` standing in for that field's value (the field on ``obj`` is
    left as it is: the caller sets it once the statement ran)."""
    exprs = exprs or {}
    quote = connection.ops.quote_name
    columns, values, params = [], [], []
    for field in obj._meta.concrete_fields:
        if field is obj._meta.auto_field and getattr(obj, field.attname) is None:
            continue  # the database numbers it
        columns.append(quote(field.column))
        if field.attname in exprs:
            sql, expr_params = exprs[field.attname]
            values.append(sql)
            params += expr_params
            continue
        value = field.pre_save(obj, add=True)
        values.append("%s")
        params.append(field.get_db_prep_save(value, connection=connection))
    sql = (
        f"INSERT INTO {quote(obj._meta.db_table)} ({', '.join(columns)})"
        f" SELECT {', '.join(values)}"
    )
    return sql, params


def insert_rows_sql(
    objs: list, *, exprs: dict[str, tuple[str, list]] | None = None
) -> tuple[str, list]:
    """``(sql, params)`` of one ``INSERT`` of the unsaved model instances
    ``objs`` (one model, at least one) in their order, as a step after a
    claim (``update_then``): a row each only when ``claimed`` holds one.
    ``INSERT INTO <table> (<columns>) SELECT … FROM claimed CROSS JOIN (VALUES
    (<a row's values>, <its place>), …) AS v ORDER BY <its place>``: numbered
    in that order on PostgreSQL and SQLite alike (the sub-statements of one
    statement run in no set order: one per row would not be). Values as
    ``insert_sql`` takes them; ``exprs``: attname → ``(SQL expression, its
    params)`` standing in for that field in every row (over ``claimed``); a
    column None in every row is left out (NULL: nothing types it in VALUES)."""
    exprs = exprs or {}
    quote = connection.ops.quote_name
    meta = objs[0]._meta
    fields = [
        field
        for field in meta.concrete_fields
        if not (field is meta.auto_field and getattr(objs[0], field.attname) is None)
    ]
    rows = []
    for obj in objs:
        rows.append(
            {
                field.attname: field.get_db_prep_save(
                    field.pre_save(obj, add=True), connection=connection
                )
                for field in fields
                if field.attname not in exprs
            }
        )
    given = [
        field
        for field in fields
        if field.attname in exprs
        or any(row[field.attname] is not None for row in rows)
    ]
    columns, values, params, listed = [], [], [], []
    for field in given:
        columns.append(quote(field.column))
        if field.attname in exprs:
            sql, expr_params = exprs[field.attname]
            values.append(sql)
            params += expr_params
        else:
            listed.append(field.attname)
            values.append(f"v.column{len(listed)}")
    place = f"v.column{len(listed) + 1}"
    marks = ", ".join(["%s"] * (len(listed) + 1))
    for number, row in enumerate(rows):
        params += [row[name] for name in listed] + [number]
    table = ", ".join(f"({marks})" for _ in rows)
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(columns)})"
        f" SELECT {', '.join(values)} FROM claimed CROSS JOIN (VALUES {table}) AS v"
        f" ORDER BY {place}"
    )
    return sql, params


def row_update(obj, fields: list[str] | tuple[str, ...]) -> int:
    """Write ``fields`` (names) of the saved model instance ``obj`` to its row,
    as ``obj.save(update_fields=fields)`` writes them (each field's
    ``pre_save``, values adapted by the ORM) but as one fixed ``UPDATE … WHERE
    <pk> = …`` with no query compiled (for writes every job's end makes).
    Returns the number of rows written (0: no such row)."""
    quote = connection.ops.quote_name
    meta = obj._meta
    columns, params = [], []
    for name in fields:
        field = meta.get_field(name)
        value = field.pre_save(obj, add=False)
        columns.append(f"{quote(field.column)} = %s")
        params.append(field.get_db_prep_save(value, connection=connection))
    params.append(meta.pk.get_db_prep_value(obj.pk, connection=connection))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(meta.db_table)} SET {', '.join(columns)}"
            f" WHERE {quote(meta.pk.column)} = %s",
            params,
        )
        return cursor.rowcount


def insert_once(obj) -> bool:
    """Store the unsaved model instance ``obj`` unless a row already holds one of
    its unique values: ``INSERT … ON CONFLICT DO NOTHING`` (PostgreSQL and
    SQLite alike; no savepoint around it). True when stored (``obj`` then
    saved, its number set), False when a unique value was taken (nothing
    written; a row being written by another transaction is waited for, as a
    plain INSERT would)."""
    sql, params = insert_sql(obj)
    pk = obj._meta.pk
    with connection.cursor() as cursor:
        cursor.execute(
            f"{sql} WHERE true ON CONFLICT DO NOTHING"
            f" RETURNING {connection.ops.quote_name(pk.column)}",
            params,
        )
        row = cursor.fetchone()
    if row is None:
        return False
    if getattr(obj, pk.attname) is None:
        setattr(obj, pk.attname, pk.to_python(row[0]))
    obj._state.adding, obj._state.db = False, connection.alias
    return True
