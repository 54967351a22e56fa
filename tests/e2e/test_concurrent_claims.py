"""DESIGN.md "Picking a device": the pick and the claim are one database step.

Real processes on PostgreSQL and Redis: two coordinator processes, a fleet of
scripted agents with fewer slots than requests, and four renter processes firing
200 requests at once. No slot is ever held twice (per device, attempts that overlap
in time never exceed its slots; an over-offered agent would refuse with an error),
no request is lost, none is answered twice.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor

import psycopg
import pytest

from tests.e2e.fire import fire

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

MACHINES = 8
SLOTS = 2
PROCESSES = 4
PER_PROCESS = 50
SCRIPT = json.dumps({"text": "The answer is 4.", "delay_s": 0.005})


@pytest.fixture
def postgres_only():
    if not os.environ.get("DATABASE_URL", "").startswith(
        ("postgres://", "postgresql://")
    ):
        pytest.skip(
            "needs PostgreSQL: row locks with SKIP LOCKED across processes (CI sets DATABASE_URL)"
        )


def _max_overlap(intervals: list[tuple]) -> int:
    events = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals]
    )
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def test_it_never_gives_one_slot_twice_under_200_concurrent_requests(
    postgres_only, stack, renter_key, machine
):
    second = stack.start_coordinator("coordinator-2")
    urls = [stack.url, second]
    for i in range(MACHINES):
        stack.start_agent(
            f"agent-{i}",
            machine(f"fleet-{i}"),
            "--engine",
            "scripted",
            "--script",
            SCRIPT,
            "--slots",
            str(SLOTS),
            server=urls[i % 2],
        )
    stack.wait_for_capacity(renter_key, "smollm2-135m-instruct", devices=MACHINES)

    with ProcessPoolExecutor(PROCESSES) as pool:
        futures = [
            pool.submit(fire, urls, renter_key, PER_PROCESS, f"p{p}")
            for p in range(PROCESSES)
        ]
        answers = [a for f in futures for a in f.result(timeout=600)]

    total = PROCESSES * PER_PROCESS
    assert len(answers) == total
    assert [a["status"] for a in answers] == [200] * total, [
        a for a in answers if a["status"] != 200
    ][:3]
    assert all(a["text"] == "The answer is 4." for a in answers)
    assert len({a["job"] for a in answers}) == total, "every request is its own job"

    with psycopg.connect(stack.env["DATABASE_URL"]) as conn:
        jobs = conn.execute("SELECT id, status FROM jobs_job").fetchall()
        assert len(jobs) == total and {s for _, s in jobs} == {"succeeded"}
        assert {str(j) for j, _ in jobs} == {a["job"] for a in answers}, (
            "no request lost"
        )
        attempts = conn.execute(
            "SELECT job_id, device_id, outcome, offered_at, ended_at FROM jobs_attempt"
        ).fetchall()
        outcomes = defaultdict(list)
        for job_id, _, outcome, _, _ in attempts:
            outcomes[job_id].append(outcome)
        assert all(o.count("succeeded") == 1 for o in outcomes.values()), (
            "answered exactly once"
        )
        refused = [a for a in attempts if a[2] != "succeeded"]
        assert not refused, f"an agent refused or failed an offer: {refused[:3]}"
        per_device = defaultdict(list)
        for _, device_id, _, offered, ended in attempts:
            per_device[device_id].append((offered, ended))
        peaks = {d: _max_overlap(iv) for d, iv in per_device.items()}
        assert max(peaks.values()) <= SLOTS, f"a slot was held twice: {peaks}"
        assert len(per_device) == MACHINES, "the whole fleet served"
        leaked = conn.execute(
            "SELECT count(*) FROM hosts_device WHERE slots_used <> 0"
        ).fetchone()[0]
        assert leaked == 0, "every slot is free at the end"
        charges = conn.execute(
            "SELECT count(*), count(DISTINCT job_id) FROM billing_ledgertransaction WHERE kind = 'charge'"
        ).fetchone()
        assert charges == (total, total), "one charge per job"
