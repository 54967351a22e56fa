"""The request's credit check against a renter's history, with the balance summed
from the ledger as the baseline in the same run.

Usage: ``.venv/bin/python bench/credit_check.py [--histories 0,10000,100000]
[--checks 300]``

On a scratch PostgreSQL database, one renter gets a history of N charges (one
balanced ledger transaction each: renter −x, platform +x) and N finished jobs,
written in bulk with SQL, and one open job; then, for each N, in the same run and
on the same connection:

* ``ballast``: ``jobs.services.credit_lock`` + ``credit_available_nano`` in one
  transaction, as the request's transaction runs them (the balance is the
  account's running ``balance_nano``, kept by a trigger: billing migration 0004;
  the open jobs through their partial index);
* ``sum``: the same lock, then the balance summed from the renter's entries with
  the same open-jobs reservation (what the running balance replaced).

Prints the machine, the settings, p50/p99 per check and whether the sides'
balances agree (the running balance against the sum).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    chat_job_store,
    django_on,
    machine_line,
    scratch_postgres,
    summary_ms,
)

SUM_SQL = (
    "SELECT (SELECT COALESCE(SUM(e.amount_nano), 0) FROM billing_entry e"
    "  WHERE e.account_id = %s),"
    " (SELECT COALESCE(SUM(COALESCE((j.params->>'max_tokens')::bigint, 0)"
    "  * c.price_completion_nano), 0)"
    "  FROM jobs_job j JOIN jobs_catalogmodel c ON c.id = j.model_id"
    "  WHERE j.renter_id = %s AND j.status IN ('queued', 'running'))"
)


def history_add(account_id: int, platform_id: int, count: int, job) -> None:
    """Append ``count`` charges of 1,000 nano-USD to the renter's account and as
    many finished jobs like ``job`` (bulk SQL): a renter's history is both."""
    from django.db import connection, transaction

    from jobs.models import Job

    columns = [f.column for f in Job._meta.concrete_fields if f.column != "id"]
    values = ["'succeeded'" if c == "status" else c for c in columns]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO jobs_job (id, {', '.join(columns)})"
            f" SELECT gen_random_uuid(), {', '.join(values)} FROM jobs_job,"
            " generate_series(1, %s) WHERE id = %s",
            [count, job.id],
        )
        cursor.execute(
            "WITH t AS (INSERT INTO billing_ledgertransaction (kind, key, memo, leg_count,"
            " created_at) SELECT 'charge', 'bench:' || gen_random_uuid(), '', 2, now()"
            " FROM generate_series(1, %s) RETURNING id)"
            " INSERT INTO billing_entry (transaction_id, account_id, amount_nano)"
            " SELECT id, %s, -1000 FROM t UNION ALL SELECT id, %s, 1000 FROM t",
            [count, account_id, platform_id],
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histories", default="0,10000,100000")
    parser.add_argument("--checks", type=int, default=300)
    args = parser.parse_args()
    print(f"machine: {machine_line()}")
    print(
        f"settings: PostgreSQL scratch database, one renter, {args.checks} checks per side "
        "and history, each in its own transaction (lock + read), one open job"
    )
    with scratch_postgres() as url:
        django_on(url)
        from django.db import connection, transaction

        from bench.compat import catalog_model, credit_available, credit_lock_id
        from billing.models import Account
        from billing.money import usd_to_nano
        from billing.services import account_for, renter_top_up
        from hosts.services import user_get_or_create
        from jobs.models import Job

        renter = user_get_or_create(email="renter@bench.example")
        renter_top_up(
            user=renter, amount_nano=usd_to_nano("1000000"), key="bench-top-up"
        )
        account = account_for(kind=Account.Kind.RENTER_CREDIT, user=renter)
        platform = account_for(kind=Account.Kind.PLATFORM)
        model = catalog_model().objects.first()
        job = chat_job_store(renter, model, "hi")
        assert job.status in Job.OPEN_STATUSES

        def ballast() -> int:
            with transaction.atomic():
                return credit_available(renter=renter)

        def by_sum() -> int:
            with transaction.atomic():
                account_id = credit_lock_id(renter=renter)
                with connection.cursor() as cursor:
                    cursor.execute(SUM_SQL, [account_id, renter.pk])
                    balance, reserved = cursor.fetchone()
                return balance - reserved

        print(f"{'history':>9} {'side':<8} latency")
        added = 0
        for history in [int(h) for h in args.histories.split(",")]:
            if history > added:
                history_add(account.id, platform.id, history - added, job)
                added = history
            with connection.cursor() as cursor:
                # as autovacuum leaves them: the bulk history's dead row
                # versions (the account's balance, rewritten per entry) gone
                cursor.execute("VACUUM ANALYZE billing_account, billing_entry")
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE jobs_job")
            for label, check in (("ballast", ballast), ("sum", by_sum)):
                with transaction.atomic():
                    for _ in range(10):
                        check()
                    times = []
                    for _ in range(args.checks):
                        start = time.perf_counter()
                        check()
                        times.append(time.perf_counter() - start)
                print(f"{history:>9} {label:<8} {summary_ms(times)}", flush=True)
            assert ballast() == by_sum(), "the balances disagree"
        print("the sides' balances agree at every history size: yes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
