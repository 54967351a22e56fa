"""Time to first token through the coordinator versus straight to the same scripted engine.

Usage: ``.venv/bin/python bench/ttft.py [--layers inmem,pubsub] [--sequential 200]
[--concurrency 50] [--rounds 4] [--agents 5] [--slots 10]``

Ballast side: a real coordinator process (uvicorn, as ``ballast.stack`` starts it) on
a scratch PostgreSQL database, real agent processes (``python -m agent run --engine
scripted``), the renter over HTTP server-sent events with httpx. Direct side, in the
same run: the same ``ScriptedEngine`` and script behind a bare ASGI app on the same
server (uvicorn, ``bench.ttft:direct_app``) that streams the same chunk shape. Time to
first token = from sending the POST to reading the first content chunk. Prints the
machine, the settings and p50/p99 of both sides and of the difference (added ms).
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

from ballast.stack import UVICORN_FLAGS  # noqa: E402
from bench.common import (  # noqa: E402
    machine_line,
    percentile,
    scratch_postgres,
    sigterm_exits,
)
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
    renter_key,
    stats_table,
)
from bench.renters import chat_body, sse_stream  # noqa: E402

SCRIPT = {"text": "The answer is four, and here are a few more words to stream.", "delay_s": 0.0}


# --- the direct side: the same engine behind a bare ASGI app ------------------------------
_engine = None


async def direct_app(scope, receive, send):
    """``POST /v1/chat/completions`` straight to a ScriptedEngine (no coordinator)."""
    global _engine
    if scope["type"] != "http":
        return
    if scope["path"] != "/v1/chat/completions":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    from agent.engines.base import GenerationRequest, GenerationResult
    from agent.engines.scripted import ScriptedEngine

    if _engine is None:
        _engine = ScriptedEngine(json.loads(os.environ.get("BENCH_SCRIPT", json.dumps(SCRIPT))))
        await _engine.load()
    body = b""
    while True:
        event = await receive()
        body += event.get("body", b"")
        if not event.get("more_body"):
            break
    req = json.loads(body)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    request = GenerationRequest(model=req["model"], messages=req["messages"],
                                params={"max_tokens": req.get("max_tokens")})
    async for piece in _engine.stream(request, GenerationResult()):
        chunk = {"id": "x", "object": "chat.completion.chunk", "model": req["model"],
                 "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        data = f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()
        await send({"type": "http.response.body", "body": data, "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def uvicorn_start(app: str, port: int, env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
         *UVICORN_FLAGS],
        cwd=ROOT, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
    )


def wait_http(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(url)


def renter_keys(env: dict, count: int) -> list[str]:
    """API keys of ``count`` more renters with credit (one manage.py process)."""
    if count <= 0:
        return []
    from ballast.stack import manage

    code = (
        "import io\nfrom django.core.management import call_command\n"
        f"for i in range({count}):\n"
        "    out = io.StringIO()\n"
        "    call_command('renter_create', f'renter{i}@bench.example', credit='1000000', stdout=out)\n"
        "    print(out.getvalue().strip().splitlines()[-1])\n"
    )
    return manage("shell", "-c", code, env=env).split()[-count:]


# --- measuring ----------------------------------------------------------------------------
async def measure(url: str, key: str, sequential: int, concurrency: int, rounds: int, warmup: int = 5,
                  counters: bool = False, keys: list[str] | None = None, pause_s: float = 0.0):
    """Return (sequential ttfts, concurrent ttfts, errors, counters), times in seconds.

    ``counters``: the instrumented coordinator's stats of each phase (sequential,
    concurrent). ``keys``: the concurrent requests' API keys, in turn (default: ``key``
    for all; one renter's parallel requests take turns on its credit lock). ``pause_s``:
    the wait after each sequential request (s).
    """
    keys = keys or [key]
    phases: list[dict] = []

    async def snapshot(reset: bool) -> None:
        if counters:
            got = await asyncio.to_thread(bench_stats, url, reset)
            if not reset:
                phases.append(got)
                await asyncio.to_thread(bench_stats, url, True)

    limits = httpx.Limits(max_connections=concurrency + 10, max_keepalive_connections=concurrency + 10)
    errors: list[str] = []
    endpoint = url + "/v1/chat/completions"
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def one(i: int, key: str = key) -> float | None:
            result = await sse_stream(client, endpoint, key, chat_body(64, f"question {i}"))
            if result.error or not result.first:
                errors.append(result.error or "no token")
                return None
            return result.first - result.start

        for i in range(warmup):
            await one(i)
        await asyncio.sleep(0.5)
        await snapshot(True)
        seq = []
        for i in range(sequential):
            if (t := await one(i)) is not None:
                seq.append(t)
            if pause_s:
                await asyncio.sleep(pause_s)
        await asyncio.sleep(0.5)  # let the last job's finish land in this phase
        await snapshot(False)
        conc: list[float] = []
        for r in range(rounds):
            got = await asyncio.wait_for(
                asyncio.gather(*(one(r * concurrency + i, keys[i % len(keys)]) for i in range(concurrency))),
                120)
            conc += [t for t in got if t is not None]
        await asyncio.sleep(0.5)
        await snapshot(False)
    return seq, conc, errors, phases


async def measure_interleaved(targets: list[tuple[str, str]], sequential: int, concurrency: int,
                              rounds: int, warmup: int = 5, pause_s: float = 0.0) -> list[tuple[list, list, list]]:
    """``--base``: measure ``targets`` ((base URL, API key) each) in one session, interleaved:
    each sequential step sends one request to every target, in a fresh random order (so no
    target always follows the same one, whose leftover work would land on it); the
    concurrent rounds go target by target, the order shuffled per round. Returns per
    target (sequential ttfts, concurrent ttfts, errors), in seconds."""
    order = random.Random(7)
    results = [([], [], []) for _ in targets]
    limits = httpx.Limits(max_connections=concurrency + 10, max_keepalive_connections=concurrency + 10)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def one(target: int, i: int) -> float | None:
            url, key = targets[target]
            result = await sse_stream(client, url + "/v1/chat/completions", key, chat_body(64, f"question {i}"))
            if result.error or not result.first:
                results[target][2].append(result.error or "no token")
                return None
            return result.first - result.start

        for i in range(warmup):
            for target in range(len(targets)):
                await one(target, i)
        await asyncio.sleep(0.5)
        sides = list(range(len(targets)))
        for i in range(sequential):
            order.shuffle(sides)
            for target in sides:
                if (t := await one(target, i)) is not None:
                    results[target][0].append(t)
                if pause_s:
                    await asyncio.sleep(pause_s)
        for r in range(rounds):
            order.shuffle(sides)
            for target in sides:
                got = await asyncio.wait_for(
                    asyncio.gather(*(one(target, r * concurrency + i) for i in range(concurrency))), 120)
                results[target][1].extend(t for t in got if t is not None)
                await asyncio.sleep(0.5)  # the round's ends land before the next target's round
    return results


def compare(args, script: str) -> int:
    """``--base REV``: commit REV's coordinator and agents beside this checkout's (each on its
    own scratch database; with pub/sub, this checkout on ``BENCH_REDIS_URL``'s db and REV on
    the next db, both flushed), and the direct app, measured interleaved. Returns the exit
    status (2: REV is not a commit)."""
    import contextlib
    import shutil

    from ballast.stack import ROOT as this_root
    from ballast.stack import Stack, port_free
    from bench.harness import REDIS_URL

    known = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{args.base}^{{commit}}"],
                           cwd=ROOT, capture_output=True, text=True)
    if known.returncode != 0:
        print(f"ttft: --base {args.base!r} is not a commit of this repository", file=sys.stderr)
        return 2
    this_db = int(REDIS_URL.rsplit("/", 1)[1] or 0)
    redis_dbs = {"this": REDIS_URL, "base": REDIS_URL.rsplit("/", 1)[0] + f"/{this_db + 1}"}
    work = Path(tempfile.mkdtemp())
    base_root = work / "base"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base_root), args.base],
                   cwd=ROOT, check=True)
    rev = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    this_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", ".", ":!bench", ":!docs"],
                           cwd=ROOT).returncode != 0
    print(f"compare: base {args.base} ({rev}) vs this checkout ({this_rev}{' + uncommitted' if dirty else ''})",
          flush=True)
    (base_root / ".venv").symlink_to(ROOT / ".venv")
    try:
        port = port_free()
        direct = uvicorn_start("bench.ttft:direct_app", port, dict(os.environ, BENCH_SCRIPT=script),
                               work / "direct.log")
        direct_url = f"http://127.0.0.1:{port}"
        try:
            wait_http(direct_url + "/")
            for layer in args.layers.split(","):
                with contextlib.ExitStack() as stacks:
                    targets = [(direct_url, "x")]
                    for side, root in (("base", base_root), ("this", this_root)):
                        db = stacks.enter_context(scratch_postgres())
                        redis_url = redis_dbs[side]
                        if layer != "inmem":
                            redis_flush(redis_url)
                        env = coordinator_env(db, layer, str(work), **(
                            {"REDIS_URL": redis_url} if layer != "inmem" else {}))
                        stack = stacks.enter_context(
                            Stack(env=env, log_dir=work / f"logs-{layer}-{side}", root=root))
                        key = ballast_start(stack, db, env, args, script, prefix=f"agent{layer}{side}",
                                            instrumented=False, root=root)
                        targets.append((stack.url, key))
                    got = asyncio.run(measure_interleaved(targets, args.sequential, args.concurrency,
                                                          args.rounds, pause_s=args.pause_s))
                (d_seq, d_conc, d_err), *sides = got
                print(line(f"direct  sequential (beside {layer})", d_seq))
                print(line(f"direct  {args.concurrency} concurrent", d_conc))
                for name, (seq, conc, err) in zip((f"base {rev}", f"this {this_rev}"), sides, strict=True):
                    print(line(f"{name}[{layer}] sequential", seq))
                    print(line(f"{name}[{layer}] {args.concurrency} concurrent", conc))
                    print_added(args.concurrency, seq, conc, d_seq, d_conc)
                    print(f"  errors {len(err)} {err[:2]}")
                print(f"  direct errors {len(d_err)} {d_err[:2]}", flush=True)
        finally:
            direct.terminate()
            direct.wait(10)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_root)], cwd=ROOT, check=False)
        shutil.rmtree(work, ignore_errors=True)
    return 0


def ballast_start(stack, db: str, env: dict, args, script: str, *, prefix: str,
                  instrumented: bool, root: Path | None = None) -> str:
    """Migrate, start the coordinator and ``args.agents`` scripted agents of ``stack``
    (on the scratch database ``db``) and wait until they are online; return a
    renter's API key (made by the checkout at ``root``, default this one)."""
    stack.migrate()
    coordinator_start(stack, instrumented=instrumented)
    key = renter_key(env, root)
    tokens = machines_bulk(db, args.agents, prefix=prefix)
    for i, token in enumerate(tokens):
        stack.start_agent(f"agent-{i}", token, "--engine", "scripted", "--script", script,
                          "--slots", str(args.slots), "--name", "Bench GPU")
    stack.wait_for_capacity(key, MODEL, devices=args.agents)
    return key


def print_added(concurrency: int, seq: list[float], conc: list[float], d_seq: list[float],
                d_conc: list[float]) -> None:
    """Print the added p50/p99 (ms) of a Ballast side over the direct side, both phases."""
    for label, b, a in (("sequential", seq, d_seq), (f"{concurrency} concurrent", conc, d_conc)):
        if b and a:
            print(f"  added, {label:<14} p50 {percentile(b, 50) * 1000 - percentile(a, 50) * 1000:8.2f} ms"
                  f"  p99 {percentile(b, 99) * 1000 - percentile(a, 99) * 1000:8.2f} ms")


def line(label: str, values: list[float]) -> str:
    if not values:  # a phase not run (--rounds 0, --sequential 0)
        return f"{label:<34} n=   0  (not run)"
    ms = [v * 1000 for v in values]
    return f"{label:<34} n={len(ms):4d}  p50 {percentile(ms, 50):8.2f} ms  p99 {percentile(ms, 99):8.2f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="inmem,pubsub")
    parser.add_argument("--sequential", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--agents", type=int, default=5)
    parser.add_argument("--delay-s", type=float, default=0.0,
                        help="the scripted engine's pause before each piece, the first "
                             "included (s): 0 measures the coordinator alone; a real "
                             "engine's first token takes its prompt's prefill")
    parser.add_argument("--pause-s", type=float, default=0.0,
                        help="the renter's pause after each sequential request (s), both sides: "
                             "0 sends the next at once; a pause lets the machine go idle between "
                             "requests, as a renter's occasional calls do")
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--renters", type=int, default=1,
                        help="renters the concurrent requests come from, in turn (each has its own credit lock)")
    parser.add_argument("--plain", action="store_true", help="serve ballast.asgi without counters")
    parser.add_argument("--profile", metavar="DIR", help="py-spy the coordinator; collapsed stacks to DIR")
    parser.add_argument("--base", metavar="REV",
                        help="also run commit REV's coordinator and agents (a temporary worktree) beside "
                             "this checkout's and the direct app, requests interleaved in random order: "
                             "before/after in one session (plain, in-memory or pub/sub per --layers)")
    args = parser.parse_args()
    sigterm_exits()
    script = json.dumps(dict(SCRIPT, delay_s=args.delay_s))

    print(f"machine: {machine_line()}")
    print(f"settings: renter httpx SSE, max_tokens 64; script {script}; {args.sequential} sequential "
          f"requests (pause {args.pause_s:g} s after each); {args.rounds} rounds of {args.concurrency} concurrent from {args.renters} "
          f"renter(s); ballast: uvicorn "
          f"(uvloop, httptools, --ws websockets), DJANGO_DEBUG=0, PostgreSQL scratch db, "
          f"{args.agents} scripted agent processes x {args.slots} slots", flush=True)
    if args.base:
        return compare(args, script)
    from ballast.stack import Stack, port_free

    results: dict[str, tuple] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # direct side
        port = port_free()
        env = dict(os.environ, BENCH_SCRIPT=script)
        direct = uvicorn_start("bench.ttft:direct_app", port, env, Path(tmp) / "direct.log")
        try:
            wait_http(f"http://127.0.0.1:{port}/")
            pid = direct.pid
            cpu0 = cpu_seconds(pid)
            results["direct"] = (*asyncio.run(measure(f"http://127.0.0.1:{port}", "x", args.sequential,
                                                      args.concurrency, args.rounds, pause_s=args.pause_s)),
                                 cpu_seconds(pid) - cpu0)
        finally:
            direct.terminate()
            direct.wait(10)
        for layer in args.layers.split(","):
            with scratch_postgres() as db:
                if layer != "inmem":
                    redis_flush()
                env = coordinator_env(db, layer, tmp)
                with Stack(env=env, log_dir=Path(tmp) / f"logs-{layer}") as stack:
                    key = ballast_start(stack, db, env, args, script, prefix=f"agent{layer}",
                                        instrumented=not args.plain)
                    keys = [key] + renter_keys(env, args.renters - 1)
                    pid = stack.processes["coordinator"].pid
                    spy = profile_start(pid, args.profile, f"ttft-{layer}")
                    cpu0 = cpu_seconds(pid)
                    results[layer] = (*asyncio.run(measure(stack.url, key, args.sequential,
                                                           args.concurrency, args.rounds,
                                                           counters=not args.plain, keys=keys,
                                                           pause_s=args.pause_s)),
                                      cpu_seconds(pid) - cpu0)
                    profile_stop(spy)

    d_seq, d_conc, d_err, _, d_cpu = results["direct"]
    print(line("direct  sequential", d_seq))
    print(line(f"direct  {args.concurrency} concurrent", d_conc))
    for layer in args.layers.split(","):
        seq, conc, err, phases, cpu = results[layer]
        n = len(seq) + len(conc) + 5
        print(line(f"ballast[{layer}] sequential", seq))
        print(line(f"ballast[{layer}] {args.concurrency} concurrent", conc))
        print_added(args.concurrency, seq, conc, d_seq, d_conc)
        print(f"  coordinator CPU {cpu / n * 1000:.1f} ms per request; errors {len(err)} {err[:2]}")
        for label, phase, count in zip(("sequential", f"{args.concurrency} concurrent"), phases,
                                       (len(seq), len(conc)), strict=False):
            print(f"  database calls per request, {label} (instrumented coordinator):")
            print("\n".join(stats_table(phase, max(count, 1), "req")))
    print(f"  direct server CPU {d_cpu / (len(d_seq) + len(d_conc) + 5) * 1000:.2f} ms per request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
