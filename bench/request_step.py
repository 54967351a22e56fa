"""The request's one database transaction in-process, as the HTTP view runs it in a
worker thread: the key, the credit, the job stored and its first claim.

Usage: ``.venv/bin/python bench/request_step.py [--requests 600]``

On a scratch PostgreSQL database: one renter with credit and an API key, one live
device with the reference model and free slots. Each request is admitted with
``bench.compat.request_admit`` (``jobs.services.job_open``: the key checked, the
credit locked and checked, the job stored, a slot claimed, one transaction),
timed from the call to its return as wall time and as the calling thread's CPU
time; the job is closed and its slot freed afterwards, untimed, so every request
sees the same tables. No baseline in the run: this is the floor the request's
transaction sets under ``bench/ttft.py``'s added time to first token; compare
commits with ``bench/ab.sh REV -- bench/request_step.py``.

Prints the machine, the settings and p50/p99 of wall and CPU time.
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument(
        "--statements",
        action="store_true",
        help="print the statements of one request (after the warm-up)",
    )
    args = parser.parse_args()
    sigterm_exits()
    print(f"machine: {machine_line()}")
    print(
        f"settings: PostgreSQL scratch database, {args.requests} requests, one renter,"
        " one live device, spot checks off"
    )
    with scratch_postgres() as url:
        django_on(
            url,
            BALLAST_SPOT_CHECKS="0",
            BALLAST_CANARY_RATE="0",
            BALLAST_HEARTBEAT_MAX_AGE_S="3600",
        )
        from bench.compat import pinned_weights_declare, request_admit
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
        pinned_weights_declare()  # (the catalog's entry pins its file)
        renter = user_get_or_create(email="renter@bench.example")
        renter_top_up(user=renter, amount_nano=10**15, key="bench")
        _, plain = services.api_key_create(user=renter)
        request = completion_request_parse(
            {
                "model": MODEL,
                "stream": True,
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "question 1"}],
            },
            endpoint=Job.Endpoint.CHAT,
        )
        wall: list[float] = []
        cpu: list[float] = []

        def one(timed: bool) -> None:
            started, started_cpu = time.perf_counter(), time.thread_time()
            job, dispatched = request_admit(
                plain=plain, request=request, waiting_channel="w.1"
            )
            if timed:
                wall.append(time.perf_counter() - started)
                cpu.append(time.thread_time() - started_cpu)
            assert dispatched.attempt is not None, f"not claimed: {dispatched}"
            Job.objects.filter(id=job.id).update(status=Job.Status.SUCCEEDED)
            Device.objects.filter(id=device.id).update(slots_used=0)

        for _ in range(20):  # warm up: the connection, the tokenizer, plans
            one(timed=False)
        if args.statements:
            from django.db import connection
            from django.test.utils import CaptureQueriesContext

            with CaptureQueriesContext(connection) as captured:
                one(timed=False)
            # the last two are the untimed clean-up's
            for number, query in enumerate(captured.captured_queries[:-2], 1):
                print(f"statement {number:2d}: {query['sql'][:150]}")
        for _ in range(args.requests):
            one(timed=True)
    print(f"request  wall {summary_ms(wall)}")
    print(f"         CPU  {summary_ms(cpu)}  (the calling thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
