"""The end of a successful job (``jobs.services.job_succeed``) against the raw writes it needs.

Usage: ``.venv/bin/python bench/job_end.py [--jobs 300] [--devices 20] [--rounds 2]
[--profile FILE]``

On a scratch PostgreSQL database it registers ``--devices`` live machines (one device
each, real Ed25519 keys, the reference model loaded) through the services, a
renter with credit, and before each side's timing dispatches and claims
``--jobs`` jobs (``job_create`` + ``job_dispatch`` + ``attempt_claim``, untimed):
each attempt is then exactly where the job's coroutine calls ``job_succeed``, with
the streamed text, a ``done`` frame and a receipt signed by its host. Then, in the
same run, alternating sides for ``--rounds`` rounds:

* ``ballast``: ``job_succeed`` per job, as the job's coroutine
  (``jobs.orchestration.JobRun``) calls it (receipt check, token recount, outcome, score, charge, earnings);
* ``bare``: the least the same end must write, as plain psycopg statements in one
  transaction per job: attempt UPDATE (compare-and-set on its state), slot
  decrement, outcome INSERT, job UPDATE, ledger transaction + 3 entries + the
  earning INSERTs — no reads, no receipt check, no score.

Per side: p50/p99/mean wall ms per job, CPU ms per job (the calling thread's
``thread_time``: the coordinator's Python and driver, not the server's) and SQL
statements per job (``connection.execute_wrapper``; the bare side counts its own).
``--profile FILE`` writes a cProfile of one extra ``ballast`` pass and prints its
top functions. Prints the machine and the settings first.
"""

from __future__ import annotations

import argparse
import base64
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    chat_job_store,
    django_on,
    machine_line,
    percentile,
    scratch_postgres,
)
from bench.harness import model_weights  # noqa: E402

MODEL = "smollm2-135m-instruct"
TEXT = "The answer is four, and here are a few more words to stream."


def fleet_make(devices: int, slots: int):
    """Register ``devices`` machines through the services; return {machine id: key}."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from hosts.services import machine_create, machine_heartbeat, machine_hello

    keys = {}
    for i in range(devices):
        machine, _ = machine_create(
            owner_email=f"host{i}@bench.example", name=f"bench-{i}"
        )
        key = Ed25519PrivateKey.generate()
        public = base64.b64encode(
            key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        ).decode()
        machine_hello(
            machine_id=str(machine.id),
            channel_name=f"bench.{i}",
            hello={
                "agent_version": "bench",
                "engine_name": "scripted",
                "engine_version": "1",
                "public_key": public,
                "accepts_serverless": True,
                "devices": [{"index": 0, "name": "Bench GPU", "vram_total_mb": 24576}],
            },
        )
        machine_heartbeat(
            machine_id=str(machine.id),
            heartbeat={
                "paused": False,
                "devices": [
                    {
                        "index": 0,
                        "temp_c": 50.0,
                        "vram_free_mb": 20000,
                        "loaded_models": [MODEL],
                        "weights": {MODEL: model_weights()},
                        "slots": slots,
                    }
                ],
            },
        )
        keys[str(machine.id)] = key
    return keys


def fleet_refresh() -> None:
    """Keep every machine live (rule 1) for the next dispatches."""
    from django.utils import timezone

    from hosts.models import Machine

    Machine.objects.update(last_heartbeat_at=timezone.now())


def renter_make():
    from billing.services import renter_top_up
    from hosts.services import user_get_or_create

    renter = user_get_or_create(email="renter@bench.example")
    renter_top_up(user=renter, amount_nano=10**15, key="bench-top-up")
    return renter


def attempts_make(renter, keys, count: int) -> list[dict]:
    """Dispatch and claim ``count`` jobs; return the arguments of their ``job_succeed``."""
    from django.utils import timezone

    from bench.compat import catalog_model, dispatch
    from billing.receipts import receipt_message
    from jobs.services import attempt_claim
    from jobs.tokens import token_count

    fleet_refresh()
    model = catalog_model().objects.get(id=MODEL)
    tokens = token_count(MODEL, TEXT) or len(TEXT.split())
    calls = []
    for _ in range(count):
        job = chat_job_store(renter, model, "What is two plus two?")
        claimed = dispatch(job_id=str(job.id), job=job, model=model)
        assert claimed.attempt is not None, claimed
        attempt = claimed.attempt
        machine_id = str(attempt.device.machine_id)
        assert attempt_claim(attempt_id=str(attempt.id), machine_id=machine_id)
        signature = keys[machine_id].sign(
            receipt_message(str(attempt.id), tokens, TEXT)
        )
        calls.append(
            dict(
                job_id=str(job.id),
                attempt_id=str(attempt.id),
                segment_text=TEXT,
                done={
                    "finish_reason": "stop",
                    "prompt_tokens": 12,
                    "completion_tokens": tokens,
                    "receipt": base64.b64encode(signature).decode(),
                },
                answer_text=TEXT,
                claimed_at=timezone.now(),
                first_token_at=timezone.now(),
                # bare side's needs (not passed to job_succeed)
                _device_id=attempt.device_id,
                _owner_id=attempt.device.machine.owner_id,
            )
        )
    return calls


def run_ballast(calls: list[dict]) -> tuple[list[float], list[float], list[int]]:
    """``job_succeed`` per call; return wall s, CPU s and statements per job."""
    from django.db import connection

    from jobs.services import job_succeed

    walls, cpus, counts = [], [], []
    statements = [0]

    def counter(execute, sql, params, many, context):
        statements[0] += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counter):
        for call in calls:
            kwargs = {k: v for k, v in call.items() if not k.startswith("_")}
            statements[0] = 0
            cpu, wall = time.thread_time(), time.perf_counter()
            job = job_succeed(**kwargs)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.thread_time() - cpu)
            counts.append(statements[0])
            assert job.status == "succeeded" and job.cost_nano > 0, job
    return walls, cpus, counts


def run_bare(url: str, calls: list[dict], accounts: dict) -> tuple[list, list, list]:
    """The raw writes of the same end, one transaction per job (see module doc)."""
    import psycopg

    walls, cpus, counts = [], [], []
    price = 200  # the reference model's completion price (nano-USD per token)
    with psycopg.connect(url) as conn:
        for call in calls:
            cpu, wall = time.thread_time(), time.perf_counter()
            tokens = call["done"]["completion_tokens"]
            cost = tokens * price
            share = cost * 80 // 100
            with conn.transaction():
                conn.execute(
                    "UPDATE jobs_attempt SET state = 'ended', outcome = 'succeeded',"
                    " ended_at = now(), output_text = %s, output_chars = %s,"
                    " first_token_at = %s, tokens_billed = %s, receipt = %s,"
                    " receipt_valid = true, completion_tokens_reported = %s,"
                    " prompt_tokens_reported = %s"
                    " WHERE id = %s AND state IN ('offered', 'claimed', 'streaming')",
                    (
                        call["segment_text"],
                        len(call["segment_text"]),
                        call["first_token_at"],
                        tokens,
                        call["done"]["receipt"],
                        tokens,
                        call["done"]["prompt_tokens"],
                        call["attempt_id"],
                    ),
                )
                conn.execute(
                    "UPDATE hosts_device SET slots_used = slots_used - 1"
                    " WHERE id = %s AND slots_used > 0",
                    (call["_device_id"],),
                )
                conn.execute(
                    "INSERT INTO hosts_deviceoutcome (device_id, source, success, reason,"
                    " model_id, ttft_ms, created_at)"
                    " VALUES (%s, 'attempt', true, 'succeeded', %s, 100, now())",
                    (call["_device_id"], MODEL),
                )
                conn.execute(
                    "UPDATE jobs_job SET status = 'succeeded', output_text = %s,"
                    " finish_reason = 'stop', tokens_billed = %s, cost_nano = %s,"
                    " prompt_tokens = %s, finished_at = now()"
                    " WHERE id = %s AND status IN ('queued', 'running')",
                    (
                        call["answer_text"],
                        tokens,
                        cost,
                        call["done"]["prompt_tokens"],
                        call["job_id"],
                    ),
                )
                txn = conn.execute(
                    "INSERT INTO billing_ledgertransaction (kind, key, job_id, memo,"
                    " leg_count, created_at) VALUES ('charge', %s, %s, '', 3, now())"
                    " RETURNING id",
                    (f"bare:{call['job_id']}", call["job_id"]),
                ).fetchone()[0]
                conn.execute(
                    "INSERT INTO billing_entry (transaction_id, account_id, amount_nano)"
                    " VALUES (%s, %s, %s), (%s, %s, %s), (%s, %s, %s)",
                    (
                        txn,
                        accounts["renter"],
                        -cost,
                        txn,
                        accounts[call["_owner_id"]],
                        share,
                        txn,
                        accounts["platform"],
                        cost - share,
                    ),
                )
                conn.execute(
                    "INSERT INTO billing_earning (attempt_id, device_id, host_id,"
                    " amount_nano, status, release_at, created_at)"
                    " VALUES (%s, %s, %s, %s, 'held', now() + interval '24 hours', now())",
                    (call["attempt_id"], call["_device_id"], call["_owner_id"], share),
                )
            walls.append(time.perf_counter() - wall)
            cpus.append(time.thread_time() - cpu)
            counts.append(7)  # BEGIN and COMMIT not counted (nor on the other side)
    return walls, cpus, counts


def accounts_make(renter, keys) -> dict:
    """Ledger account ids for the bare side (renter, platform, each host's hold)."""
    from billing.models import Account
    from billing.services import account_for
    from hosts.models import Machine

    accounts = {
        "renter": account_for(kind=Account.Kind.RENTER_CREDIT, user=renter).id,
        "platform": account_for(kind=Account.Kind.PLATFORM).id,
    }
    for machine in Machine.objects.select_related("owner"):
        accounts[machine.owner_id] = account_for(
            kind=Account.Kind.HOST_HELD, user=machine.owner
        ).id
    return accounts


def line(side: str, walls, cpus, counts) -> str:
    ms = [w * 1000 for w in walls]
    cpu_ms = [c * 1000 for c in cpus]
    return (
        f"{side:<8} n={len(ms):4d}  wall p50 {percentile(ms, 50):6.2f} ms"
        f"  p99 {percentile(ms, 99):6.2f} ms  mean {statistics.fmean(ms):6.2f} ms"
        f"  | CPU p50 {percentile(cpu_ms, 50):6.2f} ms  mean {statistics.fmean(cpu_ms):6.2f} ms"
        f"  | statements/job {statistics.fmean(counts):5.1f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300, help="jobs per side and round")
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", default="", help="cProfile output file")
    parser.add_argument(
        "--statements",
        action="store_true",
        help="print the statements of one job's end (after the warm-up)",
    )
    args = parser.parse_args()

    with scratch_postgres() as url:
        django_on(url, BALLAST_SPOT_CHECKS="0")
        from django.conf import settings
        from django.db import connection

        print(f"machine: {machine_line()}")
        print(
            f"settings: PostgreSQL scratch database ({connection.pg_version // 10000}),"
            f" {args.devices} devices (1 per machine), {args.jobs} jobs per side and"
            f" round, {args.rounds} rounds, DEBUG={settings.DEBUG},"
            f" spot checks {'on' if settings.BALLAST_SPOT_CHECKS else 'off'},"
            f" text {len(TEXT)} chars, commit per job"
        )
        slots = args.jobs * (args.rounds + 1) // args.devices + 2
        keys = fleet_make(args.devices, slots)
        renter = renter_make()
        accounts = accounts_make(renter, keys)
        # warm up: the tokenizer's vocabulary, the model median cache, connections
        run_ballast(attempts_make(renter, keys, 5))
        if args.statements:
            from django.test.utils import CaptureQueriesContext

            calls = attempts_make(renter, keys, 1)
            with CaptureQueriesContext(connection) as captured:
                run_ballast(calls)
            for number, query in enumerate(captured.captured_queries, 1):
                print(f"statement {number:2d}: {query['sql'][:150]}")
        for _ in range(args.rounds):
            for side in ("bare", "ballast"):
                calls = attempts_make(renter, keys, args.jobs)
                if side == "bare":
                    figures = run_bare(url, calls, accounts)
                else:
                    figures = run_ballast(calls)
                print(line(side, *figures), flush=True)
        if args.profile:
            import cProfile
            import pstats

            calls = attempts_make(renter, keys, args.jobs)
            profiler = cProfile.Profile()
            profiler.enable()
            run_ballast(calls)
            profiler.disable()
            profiler.dump_stats(args.profile)
            stats = pstats.Stats(profiler)
            stats.sort_stats("cumulative").print_stats(40)
            stats.sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
