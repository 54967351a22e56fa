"""``ballast.db.transaction_one_message``: a transaction sent as one message, its
statements prepared once per connection, its values as literals."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from django.db import connection
from psycopg.types.json import Jsonb

from ballast import db

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the one message is PostgreSQL's"
    ),
]

ECHO = "SELECT %s::text, %s::jsonb, %s::timestamptz, %s::uuid, %s::bigint, %s::text"


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name FROM pg_prepared_statements WHERE name LIKE 'ballast_%%'"
        )
        return [name for (name,) in cursor.fetchall()]


def test_values_arrive_exactly_as_given():
    """Quotes, backslashes, a statement's end, non-ASCII text, JSON, NULL: the
    literals carry the values, never SQL (psycopg's quoting)."""
    text = "it's \\ a 'quote'; DROP TABLE jobs_job; -- é 😀 \x01"
    values = [
        text,
        Jsonb({"content": text, "n": [1, None]}),
        datetime(2026, 11, 30, 9, 0, 0, 123456, tzinfo=UTC),
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        2**62,
        None,
    ]
    for prepare in (False, True, True):
        ((row,),) = db.transaction_one_message([(ECHO, values, prepare)])
        # Django reads jsonb as text (its JSONField decodes it)
        assert (row[0], json.loads(row[1]), *row[2:]) == (
            text,
            {"content": text, "n": [1, None]},
            *values[2:],
        )


def test_a_statement_is_prepared_once_per_connection():
    connection.ensure_connection()
    before = set(_prepared())
    for n in range(3):
        (rows,) = db.transaction_one_message([("SELECT %s::int + 1", [n], True)])
        assert rows == [(n + 1,)]
    assert len(set(_prepared()) - before) == 1


def test_past_the_bound_statements_are_sent_unprepared(monkeypatch):
    monkeypatch.setattr(db, "PREPARED_PER_CONNECTION", 0)
    connection.ensure_connection()
    before = set(_prepared())
    (rows,) = db.transaction_one_message([("SELECT %s::int * 2", [21], True)])
    assert rows == [(42,)] and set(_prepared()) == before


def test_percent_signs_in_the_text_survive_preparing():
    (rows,) = db.transaction_one_message(
        [("SELECT 'a%%b' || %s::text, 7 %% %s::int", ["c", 4], True)]
    )
    assert rows == [("a%bc", 3)]


def test_a_connection_that_lost_its_prepared_statements_prepares_them_again():
    """Anyone's ``DEALLOCATE ALL`` (or ``DISCARD ALL``) drops the session's
    prepared statements: the next message, refused, is sent again after
    preparing them (found in the 200-request e2e test: a connection's every
    request step failed with 'prepared statement … does not exist')."""
    (rows,) = db.transaction_one_message([("SELECT %s::int + 3", [1], True)])
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    assert _prepared() == []
    (rows,) = db.transaction_one_message([("SELECT %s::int + 3", [2], True)])
    assert rows == [(5,)] and len(_prepared()) == 1
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    assert db.execute_prepared("SELECT %s::int + 3", [3]) == [(6,)]
    assert len(_prepared()) == 1


def test_a_rollback_keeps_the_prepared_statements():
    """The queued dispatch's claim ran as psycopg's own prepared statement; with
    one of those held, psycopg answers any ROLLBACK with ``DEALLOCATE ALL``,
    dropping this module's statements too. ``execute_prepared`` prepares by
    SQL, as the one message does, so a rollback (a deadlock's victim, an
    ``atomic`` block's error) leaves them in place."""
    (rows,) = db.execute_prepared("SELECT %s::int * 3", [5])
    assert rows == (15,)
    db.transaction_one_message([("SELECT %s::int - 1", [5], True)])
    before = set(_prepared())
    assert len(before) == 2
    pg = connection.connection
    pg.execute("BEGIN")
    pg.execute("ROLLBACK")
    assert set(_prepared()) == before
    assert db.execute_prepared("SELECT %s::int * 3", [6]) == [(18,)]


def test_inside_a_transaction_a_lost_statement_is_raised_not_sent_again():
    from django.db import DatabaseError, transaction

    db.execute_prepared("SELECT %s::int * 4", [1])
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    with pytest.raises(DatabaseError, match="does not exist"):
        with transaction.atomic():
            db.execute_prepared("SELECT %s::int * 4", [2])
    assert db.execute_prepared("SELECT %s::int * 4", [3]) == [(12,)]


def test_statements_prepared_again_in_a_failed_transaction_are_known_after_it():
    """PREPARE is not transactional: after a lost statement fails a transaction,
    the ones prepared again inside it are still in the session. The next call
    reads which are left instead of preparing them a second time ("already
    exists" on every call after, found by a fresh-eyes check)."""
    from django.db import DatabaseError, transaction

    a, b = "SELECT %s::int * 5", "SELECT %s::int * 6"
    db.execute_prepared(a, [1])
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    with pytest.raises(DatabaseError, match="does not exist"):
        with transaction.atomic():
            assert db.execute_prepared(b, [1]) == [(6,)]  # prepared again: b is new
            db.execute_prepared(a, [1])  # the registry said a was there
    assert len(_prepared()) == 1  # b outlived the rollback
    for _ in range(2):
        assert db.execute_prepared(b, [2]) == [(12,)]
        assert db.execute_prepared(a, [2]) == [(10,)]
    assert len(_prepared()) == 2
    (rows,) = db.transaction_one_message([(a, [3], True), (b, [3], True)])[:1]
    assert rows == [(15,)]


def test_a_message_sent_again_after_a_loss_prepares_only_what_is_gone():
    """The message's own retry: its first statement is prepared afresh, its
    second was lost; sent again, only the lost one is prepared."""
    x, y = ("SELECT %s::int + 7", [1], True), ("SELECT %s::int + 8", [1], True)
    db.transaction_one_message([x])
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    assert db.transaction_one_message([y, x]) == [[(9,)], [(8,)]]
    assert db.transaction_one_message([y, x]) == [[(9,)], [(8,)]]
    assert len(_prepared()) == 2


def test_defaults_and_code_constants_are_literals_not_parameters():
    """(Fewer parameters for psycopg to quote on every request step.)"""
    from psycopg.types.numeric import Int4

    from jobs.models import Attempt, Job

    params: list = []
    fragments = [
        db.sql_value(value, params)
        for value in (None, False, 0, Int4(0), "", Job.Status.QUEUED, "it's", 7)
    ]
    assert fragments == ["NULL", "false", "0", "0", "''", "'queued'", "%s", "%s"]
    assert params == ["it's", 7]
    ((row,),) = db.transaction_one_message(
        [(f"SELECT {db.sql_value(Attempt.Kind.FRESH, [])}::text", [], True)]
    )
    assert row == ("fresh",)
