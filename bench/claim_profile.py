"""Where a Ballast claim's time goes: queries per ``job_dispatch``, their times, the plan, a profile.

Usage: ``.venv/bin/python bench/claim_profile.py [--devices 1000] [--claims 200]``

Same fleet as ``bench/claim.py`` (scratch PostgreSQL, one live device per
machine). Prints: the queries of one ``job_dispatch`` (CaptureQueriesContext) with
their times; the mean over ``--claims`` claims of wall time, time inside the
database driver and the rest (Python: ORM compile, model building); EXPLAIN
ANALYZE of the slowest query; and the top functions of a cProfile over the claims.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.claim import MODEL, jobs_make  # noqa: E402
from bench.common import machine_line, scratch_postgres  # noqa: E402
from bench.compat import pinned_weights_declare  # noqa: E402


def fleet_fill_orm(devices: int) -> None:
    """The fleet of ``bench/claim.py`` (live machines, one device, model loaded, 1 slot),
    built with the ORM so that columns added later get their model defaults."""
    from datetime import timedelta

    from django.db import connection
    from django.utils import timezone

    from hosts.models import Device, DeviceModel, Machine
    from hosts.services import user_get_or_create

    owner = user_get_or_create(email="bench@example.com")
    now = timezone.now()
    machines = Machine.objects.bulk_create(
        Machine(
            owner=owner,
            name=f"m{i}",
            region="eu",
            token_hash=f"{i:064d}",
            token_prefix="bm",
            connected=True,
            channel_name=f"bench!{i}",
            connected_at=now,
            last_heartbeat_at=now + timedelta(days=1),
        )
        for i in range(devices)
    )
    rows = Device.objects.bulk_create(
        Device(
            machine=m,
            index=0,
            name="Bench GPU",
            vram_total_mb=24576,
            vram_free_mb=20000,
            temp_c=50,
            slots_total=1,
            slots_used=0,
            score=50 + (hash(m.name) % 50),
        )
        for m in machines
    )
    DeviceModel.objects.bulk_create(
        DeviceModel(
            device=d,
            model_id=MODEL,
            loaded=True,
            first_loaded_at=now,
            ttft_ms_recent=None if d.id % 3 == 0 else 100 + d.id % 400,
        )
        for d in rows
    )
    pinned_weights_declare()
    with connection.cursor() as cur:
        cur.execute("ANALYZE")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--claims", type=int, default=200)
    args = parser.parse_args()
    with scratch_postgres() as url:
        os.environ["DATABASE_URL"] = url
        os.environ.pop("REDIS_URL", None)
        os.environ["DJANGO_DEBUG"] = "0"
        os.environ.setdefault("BALLAST_DEV", "1")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ballast.settings")
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from bench.compat import dispatch as job_dispatch
        from hosts.models import Device

        call_command("migrate", verbosity=0)
        fleet_fill_orm(args.devices)
        print(f"machine: {machine_line()}")
        print(
            f"settings: {args.devices} devices, {args.claims} claims, PostgreSQL scratch db, DEBUG off"
        )

        def claim(job_id: str) -> None:
            dispatch = job_dispatch(job_id=job_id)
            assert dispatch.attempt is not None
            Device.objects.filter(id=dispatch.attempt.device_id).update(slots_used=0)

        ids = jobs_make(args.claims + 20)
        for job_id in ids[:10]:  # warm up: connection, caches
            claim(job_id)
        statements = []  # (seconds, sql, params): what the driver was sent

        def record(execute, sql, params, many, context):
            start = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                statements.append((time.perf_counter() - start, sql, params))

        with (
            CaptureQueriesContext(connection) as ctx,
            connection.execute_wrapper(record),
        ):
            captured = job_dispatch(job_id=ids[10])  # its job read included
        Device.objects.filter(id=captured.attempt.device_id).update(slots_used=0)
        print(
            f"round trips in one job_dispatch: {len(ctx.captured_queries)}"
            " (incl. BEGIN/COMMIT if any)"
        )
        for seconds, sql, _ in statements:
            print(f"  {seconds * 1000:7.2f} ms  {' '.join(sql.split())[:150]}")
        slowest = max(statements, key=lambda q: q[0])

        # driver time vs the rest, over many claims
        driver = [0.0]

        def wrapper(execute, sql, params, many, context):
            start = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                driver[0] += time.perf_counter() - start

        todo = ids[20:]
        with connection.execute_wrapper(wrapper):
            start = time.perf_counter()
            for job_id in todo:
                dispatch = job_dispatch(job_id=job_id)
                Device.objects.filter(id=dispatch.attempt.device_id).update(
                    slots_used=0
                )
            wall = time.perf_counter() - start
        n = len(todo)
        print(
            f"per claim (incl. the slot reset): wall {wall / n * 1000:.2f} ms, in the driver "
            f"(round trip + server) {driver[0] / n * 1000:.2f} ms, Python {(wall - driver[0]) / n * 1000:.2f} ms"
        )

        import psycopg

        with psycopg.Cursor(connection.connection) as cur:  # server-side binding
            cur.execute("BEGIN")
            # replaying the captured statement: free its attempt id first
            cur.execute("DELETE FROM jobs_attempt WHERE id = %s", [captured.attempt.id])
            _, sql, params = slowest
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            print("EXPLAIN ANALYZE of the slowest query:")
            for (row,) in cur.fetchall():
                print("   ", row)
            cur.execute("ROLLBACK")

        more = jobs_make(args.claims)
        profile = cProfile.Profile()
        profile.enable()
        for job_id in more:
            claim(job_id)
        profile.disable()
        print("cProfile, cumulative, top 25:")
        stats = pstats.Stats(profile)
        stats.sort_stats("cumulative").print_stats(25)
        print("cProfile, own time, top 25:")
        stats.sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
