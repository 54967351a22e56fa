"""The request path's database step in-process, with the fourth round's way of sending
its transaction (psycopg's pipeline mode) as the baseline in the same run.

Usage: ``.venv/bin/python bench/request_step.py [--requests 600] [--block 50]``

On a scratch PostgreSQL database: one renter with credit and an API key, one live
device with the reference model and free slots. Each request is
``jobs.services.job_open_by_key`` (the whole step: the key, the credit lock, the
job and its claim), timed from the call to its return, as wall time and as the
calling thread's CPU time; the job is closed and its slot freed afterwards,
untimed, so every request sees the same tables. The two sides alternate in blocks
of ``--block`` requests on the same connection:

* ``one message``: the transaction as ``ballast.db.transaction_one_message`` sends
  it (one simple-protocol message; the statements prepared once per connection and
  run by ``EXECUTE``; the values as literals);
* ``pipeline``: the same statements through psycopg's pipeline mode (each
  statement sent and polled in turn, prepared by psycopg), as the fourth round
  sent them.

Prints the machine, the settings and p50/p99 of both sides.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    django_on,
    machine_line,
    scratch_postgres,
    sigterm_exits,
    summary_ms,
)


def transaction_pipelined(statements: list[tuple[str, list, bool]]) -> list[list]:
    """The baseline: BEGIN, ``statements``, COMMIT in psycopg's pipeline mode."""
    import psycopg
    from django.db import connection

    class _PreparedCursor(psycopg.Cursor):
        """A server-side binding cursor whose statements are always prepared."""

        def execute(self, query, params=None, **kwargs):
            return super().execute(query, params, prepare=True)

    connection.ensure_connection()
    pg = connection.connection
    if pg.prepare_threshold is None:
        pg.prepare_threshold = 2**31 - 1
    cursors = []
    try:
        with connection.wrap_database_errors, pg.pipeline():
            pg.execute("BEGIN")
            for sql, params, prepare in statements:
                cursor = connection._prepare_cursor(_PreparedCursor(pg) if prepare else pg.cursor())
                cursor.execute(sql, params)
                cursors.append(cursor)
            pg.execute("COMMIT")
    except BaseException:
        if not pg.closed and pg.info.transaction_status != 0:
            pg.execute("ROLLBACK")
        raise
    return [cursor.fetchall() if cursor.description else [] for cursor in cursors]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600, help="per side")
    parser.add_argument("--block", type=int, default=50)
    args = parser.parse_args()
    sigterm_exits()
    print(f"machine: {machine_line()}")
    print(f"settings: PostgreSQL scratch database, {args.requests} requests per side in "
          f"alternating blocks of {args.block}, one renter, one live device, spot checks off")
    with scratch_postgres() as url:
        django_on(url, BALLAST_SPOT_CHECKS="0", BALLAST_CANARY_RATE="0",
                  BALLAST_HEARTBEAT_MAX_AGE_S="3600")
        from billing.services import renter_top_up
        from hosts.models import Device
        from hosts.services import machine_create, user_get_or_create
        from jobs import services
        from jobs.models import Job
        from jobs.requests import completion_request_parse
        from tests.devices import MODEL, device_online

        owner = user_get_or_create(email="host@bench.example")
        machine, _ = machine_create(owner_email=owner.email, name="rig")
        device = device_online(machine, slots=1000)
        renter = user_get_or_create(email="renter@bench.example")
        renter_top_up(user=renter, amount_nano=10**15, key="bench")
        _, plain = services.api_key_create(user=renter)
        request = completion_request_parse(
            {"model": MODEL, "stream": True, "max_tokens": 64,
             "messages": [{"role": "user", "content": "question 1"}]},
            endpoint=Job.Endpoint.CHAT,
        )
        services.api_key_and_model(plain=plain, model_id=MODEL)  # the catalog hint
        sides = {"one message": services.transaction_one_message, "pipeline": transaction_pipelined}
        wall: dict[str, list[float]] = {name: [] for name in sides}
        cpu: dict[str, list[float]] = {name: [] for name in sides}

        def one(name: str, timed: bool) -> None:
            services.transaction_one_message = sides[name]
            started, started_cpu = time.perf_counter(), time.thread_time()
            opened = services.job_open_by_key(plain=plain, request=request, waiting_channel="w.1")
            if timed:
                wall[name].append(time.perf_counter() - started)
                cpu[name].append(time.thread_time() - started_cpu)
            assert opened is not None and opened[3].attempt is not None, "not claimed"
            Job.objects.filter(id=opened[1].id).update(status=Job.Status.SUCCEEDED)
            Device.objects.filter(id=device.id).update(slots_used=0)

        for name in sides:  # warm up: prepared statements, generic plans
            for _ in range(20):
                one(name, timed=False)
        done = 0
        while done < args.requests:
            for name in sides:
                for _ in range(args.block):
                    one(name, timed=True)
            done += args.block
        services.transaction_one_message = sides["one message"]
    for name in sides:
        print(f"{name:<12} wall {summary_ms(wall[name])}")
        print(f"{'':<12} CPU  {summary_ms(cpu[name])}  (the calling thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
