"""Heartbeats per second one coordinator process takes from many machines, and writes per heartbeat.

Usage: ``.venv/bin/python bench/heartbeats.py [--machines 5000] [--clients 2]
[--interval 2] [--seconds 15] [--layer inmem]``

Registers ``--machines`` machines in bulk in a scratch PostgreSQL database, starts one
coordinator process (``bench.instrumented_asgi``: Ballast's app plus counters), then
``--clients`` helper processes open one websocket per machine (hello, first
heartbeat) and, once all are connected, send a heartbeat from every machine every
``--interval`` s for ``--seconds`` s (offered load = machines ÷ interval per
second, phases spread evenly). Heartbeats carry the same telemetry each time (the
steady state). Measured on the coordinator: heartbeats handled (a counter after
``frame_heartbeat`` returns) ÷ the time from the first send to the last one
handled, and SQL INSERT/UPDATE/DELETE statements per heartbeat (an
``execute_wrapper`` on every connection), cross-checked with the rows of
``pg_stat_user_tables`` (n_tup_ins + n_tup_upd + n_tup_del; read after the stats
are flushed). Every loop is bounded in count and time.

Steady state: the counters are reset after every machine has said hello and sent
its first heartbeat (the liveness writes of a connection) and 12 s more, so the
window holds only steady heartbeats. Telemetry is rewritten at most every 60 s
per device (``hosts.services.TELEMETRY_REFRESH``): a window of ``--seconds`` ≥ 60
includes that refresh for every machine; a shorter one may miss it (use a smaller
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
    MODEL, bench_stats, coordinator_env, coordinator_start, cpu_seconds, machines_bulk, profile_start,
    profile_stop, redis_flush,
)


# --- client process ------------------------------------------------------------------------
async def client(ws_url: str, tokens_file: str, interval: float, seconds: float) -> None:
    """Connect every machine of the file; on ``go`` heartbeat each every ``interval`` s."""
    from websockets.asyncio.client import connect

    tokens = json.loads(Path(tokens_file).read_text())
    frame = json.dumps({"type": "heartbeat", "paused": False, "devices": [
        {"index": 0, "temp_c": 55, "vram_free_mb": 20000, "loaded_models": [MODEL], "slots": 1}]})
    sockets = []
    gate = asyncio.Semaphore(20)

    async def open_one(token: str):
        async with gate:
            ws = await connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"},
                               subprotocols=["ballast.host.v1"], open_timeout=120, ping_interval=None,
                               compression=None)
            await ws.send(json.dumps({"type": "hello", "agent_version": "bench-1",
                                      "engine": {"name": "benchsim", "version": "1"},
                                      "public_key": "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=",
                                      "accepts_serverless": True,
                                      "devices": [{"index": 0, "name": "Bench GPU", "vram_total_mb": 24576}]}))
            await asyncio.wait_for(ws.recv(), 120)
            await ws.send(frame)
            sockets.append(ws)

    await asyncio.gather(*(open_one(t) for t in tokens), return_exceptions=True)
    print(f"connected {len(sockets)}", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    if (await reader.readline()).decode().strip() != "go":
        return
    sent = 0
    start = loop.time()

    async def beat(ws, phase: float) -> None:
        nonlocal sent
        await asyncio.sleep(phase)
        n = 0
        while loop.time() - start < seconds:
            await ws.send(frame)
            sent += 1
            n += 1
            await asyncio.sleep(max(0.0, start + phase + n * interval - loop.time()))

    await asyncio.gather(*(beat(ws, random.random() * interval) for ws in sockets), return_exceptions=True)
    print(f"sent {sent}", flush=True)
    await reader.readline()  # "quit": keep the sockets open until the server drained
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
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--layer", default="inmem", choices=("inmem", "pubsub", "core"))
    parser.add_argument("--profile", metavar="DIR")
    parser.add_argument("--client", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        asyncio.run(client(args.client[0], args.client[1], float(args.client[2]), float(args.client[3])))
        return 0
    from ballast.stack import Stack

    print(f"machine: {machine_line()}")
    print(f"settings: {args.machines} machines (1 device, model loaded) over {args.clients} client processes; "
          f"a heartbeat per machine every {args.interval:g} s for {args.seconds:g} s (offered "
          f"{args.machines / args.interval:.0f}/s); channel layer {args.layer}; one uvicorn process; "
          f"PostgreSQL scratch db; DJANGO_DEBUG=0", flush=True)
    lease = {k: os.environ.get(k, d) for k, d in (("BALLAST_LEASE_S", "5"), ("BALLAST_LEASE_RENEW_S", "1"),
                                                   ("BALLAST_HEARTBEAT_MAX_AGE_S", "30"))}
    print("liveness: " + ", ".join(f"{k}={v}" for k, v in lease.items()) + "; telemetry rewritten on "
          "eligibility-visible changes or every 60 s", flush=True)
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
                    [sys.executable, __file__, "--client", ws_url, str(path), str(args.interval), str(args.seconds)],
                    cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True))
            connected = sum(int(c.stdout.readline().split()[1]) for c in clients)
            connect_s = time.perf_counter() - t_connect
            t_ready = time.time()
            print(f"connected {connected} machines in {connect_s:.1f} s "
                  f"({connected / connect_s:.0f} connects+hellos/s)", flush=True)
            time.sleep(12)  # let pg statistics of the connect phase flush (idle backends flush after 10 s)
            pg_before = pg_rows(db)
            stats0 = bench_stats(url, reset=True)
            pid = stack.processes["coordinator"].pid
            spy = profile_start(pid, args.profile, f"heartbeats-{args.layer}")
            cpu0 = cpu_seconds(pid)
            go = time.time()
            for c in clients:
                c.stdin.write("go\n")
                c.stdin.flush()
            sent = sum(int(c.stdout.readline().split()[1]) for c in clients)
            # drain: wait until the handled count stops moving (bounded)
            deadline = time.monotonic() + 120
            last = -1
            while time.monotonic() < deadline:
                try:
                    stats = bench_stats(url)
                except httpx.TimeoutException:  # the coordinator is still busy draining
                    continue
                if stats["heartbeats"] == last and stats["heartbeats"] >= sent:
                    break
                last = stats["heartbeats"]
                time.sleep(1)
            cpu = cpu_seconds(pid) - cpu0
            profile_stop(spy)
            for c in clients:
                c.stdin.write("quit\n")
                c.stdin.flush()
            time.sleep(12)
            pg_after = pg_rows(db)
            for c in clients:
                try:
                    c.wait(30)
                except subprocess.TimeoutExpired:
                    c.kill()
    handled = stats["heartbeats"]
    span = stats["last_heartbeat"] - go
    writes = sum(stats["writes"].values())
    rows = {t: pg_after.get(t, 0) - pg_before.get(t, 0) for t in pg_after}
    rows = {t: n for t, n in rows.items() if n}
    hb = stats["calls"].get("machine_heartbeat", [0, 0.0, 0])
    print(f"window: counters reset {go - t_ready:.1f} s after the last machine's first heartbeat; "
          f"measured from the first send to the last heartbeat handled ({span:.1f} s)")
    print("liveness writes in the window: " + ", ".join(
        f"{name} {stats['calls'].get(name, [0])[0]} calls" for name in
        ("lease_renew", "machines_stale_mark", "machine_heartbeat", "machine_hello", "machine_disconnect")))
    print(f"sent {sent} heartbeats in {args.seconds:g} s (offered {sent / args.seconds:.0f}/s); "
          f"handled {handled} by {span:.1f} s after the start -> {handled / span:.0f} heartbeats/s")
    print(f"coordinator CPU {cpu * 1000 / max(handled, 1):.2f} ms per heartbeat; machine_heartbeat "
          f"{hb[1] / max(hb[0], 1) * 1000:.2f} ms and {hb[2] / max(hb[0], 1):.1f} SQL statements per call")
    print(f"database writes per heartbeat: {writes / max(handled, 1):.2f} statements ("
          + ", ".join(f"{t} {n / max(handled, 1):.2f}" for t, n in sorted(stats["writes"].items())) + ")")
    print(f"pg_stat_user_tables rows written per heartbeat: {sum(rows.values()) / max(handled, 1):.2f} ("
          + ", ".join(f"{t} {n / max(handled, 1):.2f}" for t, n in sorted(rows.items())) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
