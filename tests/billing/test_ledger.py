"""The ledger is append-only and every transaction balances, checked by the database."""

from __future__ import annotations

import threading

import pytest
from django.db import (
    IntegrityError,
    InternalError,
    close_old_connections,
    connection,
    transaction,
)

from billing.models import Account, AppendOnlyError, Entry, LedgerTransaction
from billing.selectors import transactions_unbalanced
from billing.services import (
    UnbalancedTransaction,
    account_for,
    ledger_post,
    renter_top_up,
)
from jobs.models import Job

pytestmark = pytest.mark.django_db

DB_ERRORS = (IntegrityError, InternalError)


def _accounts():
    return account_for(kind=Account.Kind.FUNDING), account_for(
        kind=Account.Kind.PLATFORM
    )


def _check_deferred_constraints() -> None:
    """Run PostgreSQL's deferred checks now (they otherwise run at commit)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")


def test_it_posts_a_balanced_transaction_once_per_key():
    funding, platform = _accounts()
    first = ledger_post(kind="top_up", key="k1", legs=[(funding, -5), (platform, 5)])
    again = ledger_post(kind="top_up", key="k1", legs=[(funding, -5), (platform, 5)])
    assert first is not None and again is None
    assert LedgerTransaction.objects.filter(key="k1").count() == 1
    assert first.leg_count == 2
    _check_deferred_constraints()
    assert transactions_unbalanced() == []


def test_it_refuses_unbalanced_legs_in_the_service():
    funding, platform = _accounts()
    with pytest.raises(UnbalancedTransaction):
        ledger_post(kind="top_up", key="k2", legs=[(funding, -5), (platform, 4)])
    with pytest.raises(UnbalancedTransaction):
        ledger_post(kind="top_up", key="k3", legs=[(funding, 0)])
    assert not LedgerTransaction.objects.exists()


def test_it_refuses_updates_and_deletes_through_the_orm(renter):
    txn = LedgerTransaction.objects.get(kind=LedgerTransaction.Kind.TOP_UP)
    entry = txn.entries.first()
    entry.amount_nano = 1
    with pytest.raises(AppendOnlyError):
        entry.save()
    with pytest.raises(AppendOnlyError):
        entry.delete()
    with pytest.raises(AppendOnlyError):
        txn.delete()
    txn.memo = "changed"
    with pytest.raises(AppendOnlyError):
        txn.save()
    with pytest.raises(AppendOnlyError):
        Entry.objects.filter(id=entry.id).update(amount_nano=1)
    with pytest.raises(AppendOnlyError):
        LedgerTransaction.objects.all().delete()
    with pytest.raises(AppendOnlyError):
        txn.entries.all().update(amount_nano=2)


def test_it_refuses_an_update_in_sql(renter):
    """Below the ORM, the database's own trigger refuses to rewrite an entry."""
    entry = Entry.objects.first()
    with pytest.raises(DB_ERRORS), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE billing_entry SET amount_nano = 1 WHERE id = %s", [entry.id]
            )


def test_it_refuses_a_delete_in_sql_on_postgresql(renter):
    if connection.vendor != "postgresql":
        pytest.skip(
            "SQLite's test runner flushes with DELETE; only the ORM guard applies there"
        )
    entry = Entry.objects.first()
    with pytest.raises(DB_ERRORS), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM billing_entry WHERE id = %s", [entry.id])


def test_it_catches_an_unbalanced_transaction_in_the_database():
    """Legs written around the service that do not sum to zero are refused by the database:
    on PostgreSQL by the deferred constraint trigger (at commit; forced here), on SQLite by
    the trigger that fires when the last declared leg is inserted."""
    funding, platform = _accounts()
    with pytest.raises(DB_ERRORS), transaction.atomic():
        txn = LedgerTransaction.objects.create(kind="top_up", key="bad", leg_count=2)
        Entry.objects.bulk_create(
            [
                Entry(transaction=txn, account=funding, amount_nano=-5),
                Entry(transaction=txn, account=platform, amount_nano=4),
            ]
        )
        _check_deferred_constraints()


def test_it_catches_more_legs_than_declared_in_the_database():
    funding, platform = _accounts()
    with pytest.raises(DB_ERRORS), transaction.atomic():
        txn = LedgerTransaction.objects.create(kind="top_up", key="extra", leg_count=2)
        Entry.objects.bulk_create(
            [
                Entry(transaction=txn, account=funding, amount_nano=-5),
                Entry(transaction=txn, account=platform, amount_nano=5),
                Entry(transaction=txn, account=platform, amount_nano=1),
            ]
        )
        _check_deferred_constraints()


def test_it_finds_a_transaction_missing_declared_legs_in_the_audit():
    """SQLite cannot check at commit: a transaction with fewer legs than declared is
    found by ``transactions_unbalanced`` (PostgreSQL refuses it at commit)."""
    funding, _ = _accounts()
    if connection.vendor == "postgresql":
        with pytest.raises(DB_ERRORS), transaction.atomic():
            txn = LedgerTransaction.objects.create(
                kind="top_up", key="short", leg_count=2
            )
            Entry.objects.create(transaction=txn, account=funding, amount_nano=-5)
            _check_deferred_constraints()
        return
    txn = LedgerTransaction.objects.create(kind="top_up", key="short", leg_count=2)
    Entry.objects.create(transaction=txn, account=funding, amount_nano=-5)
    assert transactions_unbalanced() == [txn.id]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_refuses_to_commit_an_unbalanced_transaction_on_postgresql():
    """The deferred trigger fires at COMMIT, after every statement of the transaction ran."""
    if connection.vendor != "postgresql":
        pytest.skip(
            "deferred constraint triggers need PostgreSQL; SQLite checks per leg"
        )
    funding, platform = _accounts()
    with pytest.raises(DB_ERRORS):
        with transaction.atomic():
            txn = LedgerTransaction.objects.create(
                kind="top_up", key="late", leg_count=2
            )
            Entry.objects.create(transaction=txn, account=funding, amount_nano=-5)
            Entry.objects.create(transaction=txn, account=platform, amount_nano=3)
    assert not LedgerTransaction.objects.filter(key="late").exists()
    with transaction.atomic():  # a balanced one commits
        ledger_post(kind="top_up", key="fine", legs=[(funding, -5), (platform, 5)])
    assert LedgerTransaction.objects.filter(key="fine").exists()


def _race(settings, email: str) -> Job:
    """A renter's job with one receipted 7-token segment, ready to be finished."""
    from hosts.services import user_get_or_create
    from tests.billing.helpers import Rig, untokenized_model

    untokenized_model()
    settings.BALLAST_SPOT_CHECKS = False
    renter = user_get_or_create(email=email)
    renter_top_up(user=renter, amount_nano=10**9, key=f"top-up:{email}")
    rig = Rig(models=["test-13b"])
    rig.host_add(email.split("@")[0])
    job = rig.job(renter=renter, model="test-13b")
    rig.segment(job, text="abcdefghij", tokens=7)
    return job


def _at_once(target, count: int) -> tuple[list, list[BaseException]]:
    """Run ``target()`` in ``count`` threads (each its own connection) released
    together; return their results and the exceptions they raised."""
    barrier = threading.Barrier(count)
    results: list = []
    errors: list[BaseException] = []

    def run():
        try:
            barrier.wait()
            results.append(target())
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors


def _charged_once(job: Job) -> None:
    from billing.models import Earning

    charges = LedgerTransaction.objects.filter(
        job=job, kind=LedgerTransaction.Kind.CHARGE
    )
    assert charges.count() == 1
    assert Earning.objects.filter(attempt__job=job).count() == 1
    assert sorted(charges.get().entries.values_list("amount_nano", flat=True)) == [
        -7 * 333,
        467,
        1864,
    ]
    assert transactions_unbalanced() == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_charges_once_when_two_processes_finish_the_same_job(catalog, settings):
    """Two threads (two connections) finish the same job at the same moment."""
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite has a single writer")
    from jobs.services import job_finish

    job = _race(settings, "racer@example.com")
    _, errors = _at_once(
        lambda: job_finish(
            job_id=str(job.id), status=Job.Status.SUCCEEDED, output_text="abcdefghij"
        ),
        2,
    )
    assert errors == []
    _charged_once(job)
    assert Job.objects.get(id=job.id).cost_nano == 7 * 333


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_posts_a_charge_once_when_four_processes_post_it_at_once(catalog, settings):
    """Four connections post the same job's charge at once, without the job's
    row lock: the ledger key lets one through, the others post nothing."""
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite has a single writer")
    from billing.services import charge_post
    from tests.billing.helpers import charge_of

    job = _race(settings, "poster@example.com")

    def post():
        with transaction.atomic():
            return charge_post(**charge_of(Job.objects.get(id=job.id)))

    posted, errors = _at_once(post, 4)
    assert errors == []
    assert sorted(txn is None for txn in posted) == [False, True, True, True]
    _charged_once(job)
