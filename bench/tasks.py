"""The Celery beat's periodic tasks: one run's wall time at each fleet size.

Usage: ``.venv/bin/python bench/tasks.py [--fleets 1000,10000] [--rounds 2]``

For each fleet size it fills a scratch PostgreSQL database with that many live
devices (``bench.claim.fleet_fill``: one per machine, the reference model
loaded), then runs every task of ``ballast/celery.py``'s schedule in this
process (the task body, as a worker runs it, without the broker) ``--rounds``
times and prints each one's best wall time beside its interval: a task that
takes longer than its interval falls behind whatever the number of workers
(beat sends the next run while one is running). No baseline: the figure is the
headroom, interval ÷ time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import django_on, machine_line, scratch_postgres  # noqa: E402


def schedule() -> list[tuple[str, float]]:
    """``(task name, interval s)`` of every periodic task, as beat declares them."""
    from celery.schedules import schedule as interval

    from ballast.celery import app

    app.loader.import_default_modules()
    app.finalize()
    entries = app.conf.beat_schedule or {}
    found = []
    for entry in entries.values():
        every = entry["schedule"]
        seconds = every.run_every.total_seconds() if isinstance(every, interval) else float(every)
        found.append((entry["task"], seconds))
    return sorted(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleets", default="1000,10000")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    fleets = [int(n) for n in args.fleets.split(",")]
    print(f"machine: {machine_line()}")
    print(f"settings: PostgreSQL scratch database, fleets {fleets}, best of {args.rounds}")
    with scratch_postgres() as url:
        django_on(url, BALLAST_SPOT_CHECKS="1")
        import psycopg

        from ballast.celery import app
        from bench.claim import fleet_fill

        tasks = schedule()
        for fleet in fleets:
            with psycopg.connect(url, autocommit=True) as conn:
                # the last fleet's devices and what the tasks wrote about them
                conn.execute("TRUNCATE hosts_machine CASCADE")
            fleet_fill(url, fleet)
            print(f"-- {fleet:,} live devices")
            for name, every in tasks:
                task = app.tasks[name]
                best = float("inf")
                for _ in range(args.rounds):
                    started = time.perf_counter()
                    task.run()
                    best = min(best, time.perf_counter() - started)
                print(
                    f"{name:36s} every {every:6.0f} s  run {best * 1000:9.1f} ms"
                    f"  headroom {every / best:9.0f}x"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
