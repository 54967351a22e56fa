"""Ballast as ratios to the bare relay, measured in one run (issue 34).

Usage: ``.venv/bin/python bench/ratios.py [--stacks pg,embedded] [--rounds 2]
[--sequential 200] [--warmup 100] [--streams 50] [--frames 200] [--clients 16] [--seconds 10]
[--profile DIR]``

Each round, for each stack, the bare relay (``bench/bare_relay.py``: the same
public contracts, no Django, no database) and then Ballast's coordinator on that
stack (``pg``: PostgreSQL + Redis at ``--database-url``/``--redis-url``;
``embedded``: the default with no env vars, SQLite and the in-memory layer),
each started fresh, with 50 simulated machines (``bench.fasthost.FastHost``, 4
slots each, in one helper process) and the renters in this process
(``bench.ratios_measure``):

1. admission: added time to first token, ``--sequential`` streamed requests one
   after the other, the hosts answering each offer at once (p50, p99), after
   ``--warmup`` untimed ones (a warm coordinator: each pooled connection has
   prepared the request's statements and PostgreSQL has chosen their plans,
   about ten runs of each per connection, up to 8 connections);
2. relay: ``--streams`` streams × ``--frames`` one-token frames, flooded once all
   are claimed: tokens/s and the per-token latency (host send → renter receipt) p99;
3. cost per job: ``--clients`` renters sending non-streamed 4-token requests back
   to back for ``--seconds``: jobs/s completed and the server's CPU per job
   (``--profile DIR``: a py-spy record of Ballast's coordinator meanwhile,
   summarised by ``bench/profile_top.py``).

Prints the machine, the settings, each round's figures with their ratio to the
bare relay measured just before (and the 1-minute load average), then a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import machine_line, percentile, sigterm_exits  # noqa: E402
from bench.ratios_measure import SHORT_TOKENS, admission, relay, short_jobs  # noqa: E402
from bench.ratios_sides import ballast_side, bare_side  # noqa: E402
from bench.relay import SLOTS, HostSimProcess  # noqa: E402

# (figure, unit, better when higher, the target as a ratio to the bare relay, per stack)
FIGURES = (
    ("admission TTFT p50", "ms", False, {"pg": 2.5, "embedded": 3.0}),
    ("admission TTFT p99", "ms", False, {"pg": 3.0, "embedded": 3.0}),
    ("relay tokens/s", "tok/s", True, {"pg": 0.8, "embedded": 0.8}),
    ("relay per-token p99", "ms", False, {"pg": 2.0}),
    ("short jobs/s", "jobs/s", True, {"pg": 0.25, "embedded": 0.25}),
    ("CPU per short job", "ms", False, {}),
    ("idle CPU", "ms/s", False, {}),
)
STACKS = {"pg": "PostgreSQL + Redis (pub/sub layer)", "embedded": "embedded default (SQLite, in-memory layer)"}


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def side_figures(side, tmp: str, args, profile: tuple[str, str] | None) -> dict:
    """The three measurements on one running side; {figure: value}, notes."""
    sim = HostSimProcess(side.base.replace("http://", "ws://") + "/ws/host/", side.tokens, tmp)
    try:
        got = dict.fromkeys((name for name, *_ in FIGURES), float("nan"))
        errors: list[str] = []
        if "admission" in args.figures:
            times, errors = asyncio.run(admission(side.base, side.key, sim, args.sequential, args.warmup))
            ms = [t * 1000 for t in times]
            got |= {"admission TTFT p50": percentile(ms, 50), "admission TTFT p99": percentile(ms, 99)}
        if "relay" in args.figures:
            r = relay(side.base, side.key, sim, side.pid, streams=args.streams, frames=args.frames)
            got |= {"relay tokens/s": r["tok_s"], "relay per-token p99": r["p99"]}
            if r["tokens"] != r["expected"] or r["errors"]:
                errors += [f"relay: {r['tokens']}/{r['expected']} tokens {r['errors']}"]
        if "jobs" in args.figures:
            j = asyncio.run(short_jobs(side.base, side.key, sim, side.pid, clients=args.clients,
                                       seconds=args.seconds, profile=profile))
            got |= {"short jobs/s": j["jobs_s"], "CPU per short job": j["cpu_ms"],
                    "idle CPU": j["idle_ms_s"]}
            errors += j["errors"]
    finally:
        sim.close()
    got["errors"] = errors
    got["load"] = load()
    return got


def ratio(value: float, base: float) -> float:
    return value / base if base else float("nan")


def verdict(name: str, stack: str, r: float) -> str:
    higher, targets = next((h, t) for n, _, h, t in FIGURES if n == name)
    if stack not in targets:
        return ""
    bound = targets[stack]
    met = r >= bound if higher else r <= bound
    return f"{'≥' if higher else '≤'} {bound:g}×  {'met' if met else 'MISSED'}"


def print_round(number: int, stack: str, bare: dict, ours: dict) -> None:
    print(f"\nround {number} · {STACKS[stack]} · load (1 min) bare {bare['load']}, ballast {ours['load']}")
    print(f"  {'figure':<22} {'bare relay':>12} {'ballast':>12} {'ratio':>8}   target")
    for name, unit, _, _ in FIGURES:
        r = ratio(ours[name], bare[name])
        print(f"  {name + ' (' + unit + ')':<30} {bare[name]:>10.2f} {ours[name]:>12.2f} {r:>7.2f}×   "
              f"{verdict(name, stack, r)}")
    for label, side in (("bare", bare), ("ballast", ours)):
        if side["errors"]:
            print(f"  {label} errors: {len(side['errors'])}: {side['errors'][:3]}")


def profile_summary(path: Path) -> None:
    """``bench/profile_top.py``'s summary of a py-spy record, the project's frames."""
    if not path.exists():
        print(f"  (no profile at {path}: py-spy not found or not permitted)")
        return
    print(f"\nprofile of the coordinator during the short jobs ({path}):")
    subprocess.run([sys.executable, str(ROOT / "bench/profile_top.py"), str(path), "--drop-idle",
                    "--top", "40"], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", default="pg,embedded")
    parser.add_argument("--figures", default="admission,relay,jobs",
                        help="which measurements (admission, relay, jobs); all by default")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sequential", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=100,
                        help="untimed admission requests before the timed ones")
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/ballast_bench"),
        help="pg's database: dropped and made again for each side")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/1"),
                        help="pg's Redis db: flushed for each side")
    parser.add_argument("--profile", metavar="DIR", help="py-spy the coordinator during the short jobs")
    args = parser.parse_args()
    sigterm_exits()
    stacks = args.stacks.split(",")
    print(f"machine: {machine_line()}; load (1 min) at start {load()}")
    print(f"settings: 50 simulated machines x {SLOTS} slots (one helper process), renters in this "
          f"process (httpx); servers on uvicorn (uvloop, httptools, --ws websockets); ballast: "
          f"DJANGO_DEBUG=0, spot checks off; pg = {args.database_url} + {args.redis_url}; "
          f"admission: {args.sequential} sequential streamed requests after {args.warmup} untimed, "
          f"{SHORT_TOKENS} tokens each; "
          f"relay: {args.streams} streams x {args.frames} one-token frames (SSE); short jobs: "
          f"{args.clients} clients, non-streamed, {SHORT_TOKENS} tokens, {args.seconds:g} s; "
          f"{args.rounds} rounds, the bare relay just before Ballast each time", flush=True)
    rounds: list[tuple[str, dict, dict]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for number in range(1, args.rounds + 1):
            for stack in stacks:
                with bare_side(tmp) as side:
                    bare = side_figures(side, tmp, args, None)
                with ballast_side(stack, tmp, database_url=args.database_url,
                                  redis_url=args.redis_url) as side:
                    profile = (args.profile, f"jobs-{stack}-{number}") if args.profile else None
                    ours = side_figures(side, tmp, args, profile)
                rounds.append((stack, bare, ours))
                print_round(number, stack, bare, ours)
                sys.stdout.flush()
    print("\nsummary (ratio to the bare relay of the same round, each round):")
    for stack in stacks:
        mine = [(b, o) for s, b, o in rounds if s == stack]
        for name, _, _, _ in FIGURES:
            ratios = ", ".join(f"{ratio(o[name], b[name]):.2f}×" for b, o in mine)
            print(f"  {stack:<9} {name:<22} {ratios}")
    if args.profile:
        for stack in stacks:
            profile_summary(Path(args.profile) / f"jobs-{stack}-{args.rounds}.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
