"""Model instances from a fixed SELECT: the reads every job's end makes, without
the ORM compiling their query at every call (issue 34: an ORM read costs about
1 ms of CPU here, a fixed one about 0.2 ms).

A caller writes the ``FROM … WHERE …`` of its read once and names the models
it selects, each under a table alias: ``columns`` gives the select list (every
concrete column of each model, in field order, as the ORM loads them) and
``instances`` turns a row of it into one instance per model, its values
converted as the ORM converts them (``from_db_value``, the backend's own
converters: SQLite's datetimes, UUIDs and booleans, JSON), the instance marked
as loaded from the database. The caller links the instances (``attempt.device =
device``), as ``select_related`` would have. The same SQL text runs on
PostgreSQL and SQLite (CONVENTIONS.md "Speed without a second path").
"""

from __future__ import annotations

import functools

from django.db import connection
from django.db.models import Field, Model

Part = tuple[type[Model], str]
"""A model selected and the alias of its table in the caller's ``FROM``."""


def columns(*parts: Part) -> str:
    """The select list of ``parts``: ``alias."column", …`` for every concrete
    field of each model in turn (``"a"."id", "a"."job_id", …, "d"."id", …``)."""
    return ", ".join(
        _plan(model, alias, connection.vendor)[0] for model, alias in parts
    )


def instances(row: tuple, *parts: Part) -> list[Model | None]:
    """One instance per part from ``row`` (selected with ``columns(*parts)``),
    in ``parts``' order; None for a part whose primary key is NULL (a ``LEFT
    JOIN`` that found no row). Raises ``ValueError`` when the row's length is
    not the select list's."""
    found: list[Model | None] = []
    start = 0
    for model, alias in parts:
        _, names, converters, pk_at = _plan(model, alias, connection.vendor)
        values = list(row[start : start + len(names)])
        if len(values) != len(names):
            raise ValueError(
                f"a row of {len(row)} values for {len(names)} more columns"
            )
        start += len(names)
        if values[pk_at] is None:
            found.append(None)
            continue
        for at, convert in converters:
            values[at] = convert(values[at])
        found.append(model.from_db(connection.alias, names, values))
    if start != len(row):
        raise ValueError(f"a row of {len(row)} values for {start} columns")
    return found


def value(field: Field, raw):
    """``raw``, a value of a fixed SELECT of ``field``'s type (its column, or
    an expression over it such as ``MAX``), converted as the ORM converts
    that field's column (SQLite's datetimes arrive as text)."""
    convert = _converter(field, connection.vendor)
    return raw if convert is None else convert(raw)


@functools.cache
def _converter(field: Field, vendor: str):
    """The ORM's converters of ``field``'s column chained, or None (cached
    per process, as ``_plan``)."""
    col = field.get_col(field.model._meta.db_table)
    chain = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
    return _chained(chain, col) if chain else None


@functools.cache
def _plan(model: type[Model], alias: str, vendor: str):
    """(select list, attnames, [(index, convert)], index of
    the primary key) of ``model`` under ``alias`` on this connection's
    backend (cached per process: the fields and converters never change)."""
    quote = connection.ops.quote_name
    fields = list(model._meta.concrete_fields)
    select = ", ".join(f"{quote(alias)}.{quote(f.column)}" for f in fields)
    converters = []
    for at, field in enumerate(fields):
        col = field.get_col(alias)
        chain = connection.ops.get_db_converters(col) + col.get_db_converters(
            connection
        )
        if chain:
            converters.append((at, _chained(chain, col)))
    pk_at = fields.index(model._meta.pk)
    return select, [f.attname for f in fields], converters, pk_at


def _chained(chain, col):
    """One function applying the ORM's converters ``chain`` of column ``col``
    in order, as its compiler does (``value, expression, connection``)."""

    def convert(value):
        for step in chain:
            value = step(value, col, connection)
        return value

    return convert
