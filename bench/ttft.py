"""Time to first token through the coordinator versus straight to the same scripted engine.

Usage: ``.venv/bin/python bench/ttft.py [--layers inmem,pubsub] [--sequential 200]
[--concurrency 50] [--rounds 4] [--agents 5] [--slots 10]``

Ballast side: a real coordinator process (uvicorn, as ``ballast.stack`` starts it) on
a scratch PostgreSQL database, real agent processes (``python -m agent run --engine
scripted``), the renter over HTTP server-sent events with httpx. Direct side, in the
same run: the same ``ScriptedEngine`` and script behind a bare ASGI app on the same
server (uvicorn, ``bench.ttft_sides:direct_app``) that streams the same chunk shape. Time to
first token = from sending the POST to reading the first content chunk. Prints the
machine, the settings and p50/p99 of both sides and of the difference (added ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    machine_line,
    scratch_postgres,
    sigterm_exits,
)
from bench.harness import (  # noqa: E402
    coordinator_env,
    cpu_seconds,
    profile_start,
    profile_stop,
    redis_flush,
    stats_table,
)
from bench.ttft_compare import compare  # noqa: E402
from bench.ttft_measure import line, measure, print_added  # noqa: E402
from bench.ttft_sides import (  # noqa: E402
    SCRIPT,
    ballast_start,
    renter_keys,
    uvicorn_start,
    wait_http,
)


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
        direct = uvicorn_start("bench.ttft_sides:direct_app", port, env, Path(tmp) / "direct.log")
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
