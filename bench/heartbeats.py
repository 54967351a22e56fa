"""Heartbeats per second one coordinator process takes from many machines, and writes per heartbeat.

Usage: ``.venv/bin/python bench/heartbeats.py [--machines 5000] [--clients 2]
[--interval 2] [--seconds 15] [--settle 12] [--layer inmem]``

Registers ``--machines`` machines in bulk in a scratch PostgreSQL database, starts one
coordinator process (``bench.instrumented_asgi``: Ballast's app plus counters), then
``--clients`` helper processes open one websocket per machine (hello, first
heartbeat). Once every machine is connected they send a heartbeat from each
machine every ``--interval`` s (phases spread at random; offered load = machines ÷
interval per second), the same telemetry each time. The bench then waits
``--settle`` s (at least two intervals: the machines that went stale while the
others connected are un-marked, connect-phase writes are done, PostgreSQL
statistics flushed), resets the counters and measures a window of ``--seconds`` s
of this steady state: heartbeats handled (a counter after ``frame_heartbeat`` returns) ÷
the window (the offered load keeps coming: a coordinator that cannot keep up
handles less than it is sent), and SQL INSERT/UPDATE/DELETE statements per
heartbeat (an ``execute_wrapper`` on every connection), cross-checked with the
rows of ``pg_stat_user_tables`` (n_tup_ins + n_tup_upd + n_tup_del, read 12 s
after the window, before any socket closes). Every loop is bounded in count and
time.

Unchanged telemetry is rewritten every 60 s per device at the 2 s interval
(``hosts.services.telemetry_refresh``: 60 s or 25 intervals): a window of ``--seconds`` ≥ 60 includes
that refresh for every machine; a shorter one may miss it (use a smaller
``--machines`` for a long window). The process lease's renewals
(``hosts.liveness``, one write per process per ``BALLAST_LEASE_RENEW_S``) are
counted as writes like any other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import machine_line, scratch_postgres  # noqa: E402
from bench.harness import (  # noqa: E402
    MODEL,
    bench_stats,
    coordinator_env,
    coordinator_start,
    cpu_seconds,
    machines_bulk,
    profile_start,
    profile_stop,
    redis_flush,
)


# --- client process ------------------------------------------------------------------------
async def client(ws_url: str, tokens_file: str, interval: float) -> None:
    """Connect every machine of the file (hello, first heartbeat); stdin ``beat`` starts
    a heartbeat from each every ``interval`` s, ``go`` starts the count, ``stop``
    prints it and stops the beats, ``quit`` closes the sockets. Bounded: the beats
    end after one hour anyway."""
    from websockets.asyncio.client import connect

    tokens = json.loads(Path(tokens_file).read_text())
    frame = json.dumps({"type": "heartbeat", "paused": False, "devices": [
        {"index": 0, "temp_c": 55, "vram_free_mb": 20000, "loaded_models": [MODEL], "slots": 1}]})
    sockets, beats = [], []
    gate = asyncio.Semaphore(20)
    loop = asyncio.get_running_loop()
    sent = 0
    stop = asyncio.Event()
    end = loop.time() + 3600

    async def beat(ws) -> None:
        nonlocal sent
        start, n = loop.time(), 0
        phase = random.random() * interval
        while not stop.is_set() and loop.time() < end:
            await ws.send(frame)
            sent += 1
            n += 1
            await asyncio.sleep(max(0.0, start + phase + n * interval - loop.time()))

    async def open_one(token: str):
        async with gate:
            ws = await connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"},
                               subprotocols=["ballast.host.v1"], open_timeout=120, ping_interval=None,
                               compression=None)
            import base64

            from cryptography.hazmat.primitives.asymmetric.ed25519 import (
                Ed25519PrivateKey,
            )
            from cryptography.hazmat.primitives.serialization import (
                Encoding,
                PublicFormat,
            )

            key = Ed25519PrivateKey.generate()
            public = base64.b64encode(
                key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
            nonce = json.loads(await asyncio.wait_for(ws.recv(), 120))["nonce"]
            proof = base64.b64encode(
                key.sign(f"ballast-hello/v1\n{nonce}\n{public}".encode())).decode()
            await ws.send(json.dumps({"type": "hello", "agent_version": "bench-1",
                                      "engine": {"name": "benchsim", "version": "1"},
                                      "public_key": public, "proof": proof,
                                      "accepts_serverless": True,
                                      "devices": [{"index": 0, "name": "Bench GPU", "vram_total_mb": 24576}]}))
            await asyncio.wait_for(ws.recv(), 120)
            await ws.send(frame)
            sockets.append(ws)

    await asyncio.gather(*(open_one(t) for t in tokens), return_exceptions=True)
    print(f"connected {len(sockets)}", flush=True)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    if (await reader.readline()).decode().strip() != "beat":
        return
    beats.extend(asyncio.create_task(beat(ws)) for ws in sockets)
    if (await reader.readline()).decode().strip() != "go":
        return
    at_go = sent
    await reader.readline()  # "stop"
    stop.set()
    print(f"sent {sent - at_go}", flush=True)
    await asyncio.gather(*beats, return_exceptions=True)
    await reader.readline()  # "quit": keep the sockets open until the statistics are read
    for ws in sockets:
        await ws.close()


def pg_rows(db: str) -> dict[str, int]:
    """n_tup_ins + n_tup_upd + n_tup_del per table (flushed statistics)."""
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        return {name: n for name, n in conn.execute(
            "SELECT relname, n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--interval", type=float, default=2.0, help="s between a machine's heartbeats")
    parser.add_argument("--seconds", type=float, default=15.0, help="the measurement window (s)")
    parser.add_argument("--settle", type=float, default=12.0,
                        help="s of heartbeats between the last connect and the window (≥ 2 intervals)")
    parser.add_argument("--layer", default="inmem", choices=("inmem", "pubsub", "core"))
    parser.add_argument("--profile", metavar="DIR")
    parser.add_argument("--client", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        asyncio.run(client(args.client[0], args.client[1], float(args.client[2])))
        return 0
    from ballast.stack import Stack

    print(f"machine: {machine_line()}")
    print(f"settings: {args.machines} machines (1 device, model loaded) over {args.clients} client processes; "
          f"a heartbeat per machine every {args.interval:g} s once all are connected (offered "
          f"{args.machines / args.interval:.0f}/s); window {args.seconds:g} s after {args.settle:g} s of settling; "
          f"channel layer {args.layer}; one uvicorn process; PostgreSQL scratch db; DJANGO_DEBUG=0", flush=True)
    lease = {k: os.environ.get(k, d) for k, d in (("BALLAST_LEASE_S", "5"), ("BALLAST_LEASE_RENEW_S", "1"),
                                                   ("BALLAST_HEARTBEAT_MAX_AGE_S", "30"))}
    print("liveness: " + ", ".join(f"{k}={v}" for k, v in lease.items()) + " (if the code has a lease); "
          "telemetry rewritten on eligibility-visible changes or every 60 s", flush=True)
    with tempfile.TemporaryDirectory() as tmp, scratch_postgres() as db:
        if args.layer != "inmem":
            redis_flush()
        env = coordinator_env(db, args.layer, tmp, BALLAST_HEARTBEAT_INTERVAL_S=str(args.interval))
        with Stack(env=env, log_dir=Path(tmp) / "logs") as stack:
            stack.migrate()
            tokens = machines_bulk(db, args.machines, prefix="hb")
            url = coordinator_start(stack)
            ws_url = url.replace("http://", "ws://") + "/ws/host/"
            clients = []
            t_connect = time.perf_counter()
            for i in range(args.clients):
                path = Path(tmp) / f"tokens-{i}.json"
                path.write_text(json.dumps(tokens[i::args.clients]))
                clients.append(subprocess.Popen(
                    [sys.executable, __file__, "--client", ws_url, str(path), str(args.interval)],
                    cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True))
            connected = sum(int(c.stdout.readline().split()[1]) for c in clients)
            connect_s = time.perf_counter() - t_connect
            print(f"connected {connected} machines in {connect_s:.1f} s "
                  f"({connected / connect_s:.0f} connects+hellos/s)", flush=True)
            for c in clients:
                c.stdin.write("beat\n")
                c.stdin.flush()
            time.sleep(max(args.settle, 2 * args.interval))
            pg_before = pg_rows(db)
            pid = stack.processes["coordinator"].pid

            def stats_read(reset: bool = False) -> dict:
                for _ in range(12):  # a coordinator far behind may answer late: bounded retries
                    try:
                        return bench_stats(url, reset=reset)
                    except httpx.TimeoutException:
                        continue
                raise RuntimeError("the coordinator never answered /bench/stats")

            stats_read(reset=True)
            t0 = time.perf_counter()
            for c in clients:
                c.stdin.write("go\n")
                c.stdin.flush()
            spy = profile_start(pid, args.profile, f"heartbeats-{args.layer}")
            cpu0 = cpu_seconds(pid)
            time.sleep(args.seconds)
            stats = stats_read()
            window = time.perf_counter() - t0
            cpu = cpu_seconds(pid) - cpu0
            profile_stop(spy)
            for c in clients:
                c.stdin.write("stop\n")
                c.stdin.flush()
            sent = sum(int(c.stdout.readline().split()[1]) for c in clients)
            time.sleep(12)  # idle backends flush their statistics; no machine is stale yet (< 24 s)
            pg_after = pg_rows(db)
            final = stats_read()
            for c in clients:
                c.stdin.write("quit\n")
                c.stdin.flush()
            for c in clients:
                try:
                    c.wait(60)
                except subprocess.TimeoutExpired:
                    c.kill()
    handled = stats["heartbeats"]
    writes = sum(stats["writes"].values())
    rows = {t: pg_after.get(t, 0) - pg_before.get(t, 0) for t in pg_after}
    rows = {t: n for t, n in rows.items() if n}
    hb = stats["calls"].get("machine_heartbeat", [0, 0.0, 0])
    print(f"window: {window:.1f} s of steady state, after {max(args.settle, 2 * args.interval):g} s of heartbeats "
          "from every machine")
    print(f"sent {sent} heartbeats in the window ({sent / window:.0f}/s); handled {handled} "
          f"-> {handled / window:.0f} heartbeats/s")
    print("calls in the window: " + ", ".join(
        f"{name} {stats['calls'].get(name, [0])[0]}" for name in
        ("machine_heartbeat", "lease_renew", "machines_stale_mark", "machine_hello", "machine_disconnect")))
    print(f"coordinator CPU {cpu * 1000 / max(handled, 1):.2f} ms per heartbeat handled; machine_heartbeat "
          f"{hb[1] / max(hb[0], 1) * 1000:.2f} ms and {hb[2] / max(hb[0], 1):.1f} SQL statements per call")
    print(f"database writes per heartbeat (window): {writes / max(handled, 1):.4f} statements, {writes} in all ("
          + ", ".join(f"{t} {n}" for t, n in sorted(stats["writes"].items())) + ")")
    fw = sum(final["writes"].values())
    print(f"until the statistics were read ({final['heartbeats']} heartbeats handled): {fw} write statements "
          f"= {fw / max(final['heartbeats'], 1):.4f}/heartbeat; pg_stat_user_tables rows written "
          f"{sum(rows.values())} = {sum(rows.values()) / max(final['heartbeats'], 1):.4f}/heartbeat ("
          + ", ".join(f"{t} {n}" for t, n in sorted(rows.items())) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
