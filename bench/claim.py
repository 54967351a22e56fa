"""Pick-and-claim throughput and latency on PostgreSQL, against a bare SKIP LOCKED loop.

Usage: ``.venv/bin/python bench/claim.py [--fleets 1000,10000,100000] [--claims 500]``

For each fleet size it fills a scratch database with that many live devices (one
per machine, the reference model loaded), then measures, in the same run:

* ``ballast``: ``jobs.services.job_dispatch`` — the real eligibility rules, ranking
  and claim (``SKIP LOCKED``, compare-and-set on the slot, attempt row, job
  status), from the job id only (the job and model rows read in the timing);
* ``held``: the same, called as the request's transaction and the job's
  coroutine call it, with the job and model rows they already hold: two reads
  fewer (the figure to hold against ``bare``);
* ``bare``: a plain psycopg loop doing the least the same claim needs on the same
  tables — one ranked ``SELECT … LIMIT 1 FOR UPDATE SKIP LOCKED`` over live,
  loaded, free devices, the slot update, the attempt insert, commit.

Each claim is timed alone (job rows are created beforehand, outside the timing);
the slot is released after each claim so the fleet never fills. ``--workers``
threads claim concurrently for the throughput figure. Prints the machine, the
settings and the figures.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    django_on,
    machine_line,
    scratch_postgres,
    summary_ms,
)
from bench.compat import pinned_weights_declare  # noqa: E402

MODEL = "smollm2-135m-instruct"


def fleet_fill(url: str, devices: int) -> None:
    """Insert ``devices`` live machines with one device each, model loaded, 1 slot."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "DELETE FROM jobs_attempt; DELETE FROM jobs_job; DELETE FROM hosts_devicemodel;"
        )
        conn.execute("DELETE FROM hosts_device; DELETE FROM hosts_machine;")
        owner = conn.execute(
            "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, email,"
            " is_staff, is_active, date_joined) VALUES ('', false, 'bench@example.com', '', '',"
            " 'bench@example.com', false, true, now()) ON CONFLICT (username) DO UPDATE"
            " SET email = EXCLUDED.email RETURNING id"
        ).fetchone()[0]
        conn.execute(
            """
            INSERT INTO hosts_machine (id, owner_id, name, region, token_hash, token_prefix,
                public_key, agent_version, engine_name, engine_version, accepts_serverless,
                paused, host_paused, connected, channel_name, connected_at, last_heartbeat_at,
                created_at)
            SELECT gen_random_uuid(), %s, 'm' || g, 'eu', md5('t' || g) || md5('u' || g), 'bm',
                '', '1', 'bench', '1', true, false, false, true, 'bench!' || g, now(),
                now() + interval '1 day', now()
            FROM generate_series(1, %s) g
            """,
            (owner, devices),
        )
        conn.execute(
            """
            INSERT INTO hosts_device (machine_id, index, name, vram_total_mb, vram_free_mb, temp_c,
                slots_total, slots_used, score, quarantined, paused, first_seen_at,
                spot_check_reason)
            SELECT id, 0, 'Bench GPU', 24576, 20000, 50, 1, 0,
                50 + (abs(hashtext(name)) % 50), false, false, now(), ''
            FROM hosts_machine
            """
        )
        conn.execute(
            """
            INSERT INTO hosts_devicemodel (device_id, model_id, loaded, ttft_ms_recent, first_loaded_at)
            SELECT id, %s, true, CASE WHEN id %% 3 = 0 THEN NULL ELSE 100 + id %% 400 END, now()
            FROM hosts_device
            """,
            (MODEL,),
        )
        pinned_weights_declare()
        conn.execute("ANALYZE")


def jobs_make(count: int):
    """Create ``count`` queued jobs through the ORM; return their ids."""
    from bench.compat import catalog_model
    from jobs.models import Job

    model = catalog_model().objects.get(id=MODEL)
    jobs = [
        Job(
            model_id=model.id,
            endpoint="chat",
            messages=[{"role": "user", "content": "x"}],
            params={"max_tokens": 8},
            placement={},
            status=Job.Status.RUNNING,
        )
        for _ in range(count)
    ]
    Job.objects.bulk_create(jobs)
    return [str(j.id) for j in jobs]


def run_ballast(
    job_ids: list[str], workers: int, *, held: bool = False
) -> tuple[list[float], float]:
    """Claim once per job with job_dispatch (``bench.compat.dispatch``); return
    per-claim durations and wall time.

    ``held``: pass the job and model rows as ``jobs.services.job_open`` and the
    job's coroutine do, read beforehand outside the timing; otherwise both are
    read from the job id inside the timing.
    """
    from django.db import connection

    from bench.compat import catalog_model, dispatch
    from hosts.models import Device
    from jobs.models import Job

    durations: list[float] = []
    lock = threading.Lock()
    chunks = [job_ids[i::workers] for i in range(workers)]
    rows, model = {}, None
    if held:
        model = catalog_model().objects.get(id=MODEL)
        rows = {str(j.id): j for j in Job.objects.filter(id__in=job_ids)}

    def worker(ids: list[str]) -> None:
        for job_id in ids:
            kwargs = {"job": rows[job_id], "model": model} if held else {}
            start = time.perf_counter()
            claimed = dispatch(job_id=job_id, **kwargs)
            elapsed = time.perf_counter() - start
            assert claimed.attempt is not None, claimed
            Device.objects.filter(id=claimed.attempt.device_id).update(slots_used=0)
            with lock:
                durations.append(elapsed)
        connection.close()

    wall = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(chunk,)) for chunk in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return durations, time.perf_counter() - wall


BARE_PICK = """
SELECT d.id FROM hosts_device d
JOIN hosts_machine m ON m.id = d.machine_id
JOIN hosts_devicemodel dm ON dm.device_id = d.id AND dm.model_id = %s AND dm.loaded
WHERE m.connected AND m.last_heartbeat_at > now() - interval '30 seconds'
  AND d.slots_used < d.slots_total
ORDER BY d.score DESC
LIMIT 1
FOR UPDATE OF d SKIP LOCKED
"""


def run_bare(url: str, job_ids: list[str], workers: int) -> tuple[list[float], float]:
    """The bare psycopg SKIP LOCKED claim loop on the same tables."""
    import psycopg

    durations: list[float] = []
    lock = threading.Lock()
    chunks = [job_ids[i::workers] for i in range(workers)]

    def worker(ids: list[str]) -> None:
        with psycopg.connect(url) as conn:
            for job_id in ids:
                start = time.perf_counter()
                with conn.transaction():
                    device_id = conn.execute(BARE_PICK, (MODEL,)).fetchone()[0]
                    conn.execute(
                        "UPDATE hosts_device SET slots_used = slots_used + 1 WHERE id = %s",
                        (device_id,),
                    )
                    conn.execute(
                        "INSERT INTO jobs_attempt (id, job_id, device_id, kind, state, outcome,"
                        " error_message, continue_from_chars, offered_at, claim_deadline,"
                        " output_text, output_chars, tokens_billed, receipt, token_count_flagged)"
                        " VALUES (%s, %s, %s, 'fresh', 'offered', '', '', 0, now(),"
                        " now() + interval '5 seconds', '', 0, 0, '', false)",
                        (uuid.uuid4(), job_id, device_id),
                    )
                elapsed = time.perf_counter() - start
                conn.execute(
                    "UPDATE hosts_device SET slots_used = 0 WHERE id = %s", (device_id,)
                )
                conn.commit()
                with lock:
                    durations.append(elapsed)

    wall = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(chunk,)) for chunk in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return durations, time.perf_counter() - wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleets", default="1000,10000,100000")
    parser.add_argument(
        "--claims", type=int, default=500, help="claims per side and fleet"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="concurrent claiming threads"
    )
    args = parser.parse_args()
    fleets = [int(x) for x in args.fleets.split(",")]

    with scratch_postgres() as url:
        django_on(url)
        print(f"machine: {machine_line()}")
        print(
            f"settings: PostgreSQL scratch database, {args.claims} claims per side, "
            f"{args.workers} worker thread(s), 1 slot per device, slot released after each claim"
        )
        print(f"{'devices':>8} {'side':<8} {'claims/s':>9}  latency")
        for devices in fleets:
            fleet_fill(url, devices)
            for side in ("bare", "ballast", "held") * 2:
                ids = jobs_make(args.claims)
                if side == "bare":
                    durations, wall = run_bare(url, ids, args.workers)
                else:
                    durations, wall = run_ballast(
                        ids, args.workers, held=side == "held"
                    )
                print(
                    f"{devices:>8} {side:<8} {len(durations) / wall:9.0f}  {summary_ms(durations)}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
