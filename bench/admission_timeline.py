"""Where the admission's time to first token goes: a timeline of each request's steps.

Usage: ``.venv/bin/python bench/admission_timeline.py [--stack pg|embedded]
[--sequential 200]``

The bare relay, then Ballast's coordinator serving ``bench.timeline_asgi`` (the
same application, each step of the request in flight marked), both with 50
simulated machines answering each offer at once (``bench.ratios_measure.
admission``: streamed requests one after the other). Prints both sides' time to
first token and, for Ballast, each step's median time from the request's
arrival at the application, and the median gap from the step before.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import machine_line, percentile, sigterm_exits  # noqa: E402
from bench.ratios_measure import admission  # noqa: E402
from bench.ratios_sides import ballast_side, bare_side  # noqa: E402
from bench.relay import HostSimProcess  # noqa: E402


def _ttft(side, tmp: str, n: int, warmup: int) -> list[float]:
    sim = HostSimProcess(
        side.base.replace("http://", "ws://") + "/ws/host/", side.tokens, tmp
    )
    try:
        times, errors = asyncio.run(admission(side.base, side.key, sim, n, warmup))
    finally:
        sim.close()
    if errors:
        print(f"  {side.name}: {len(errors)} errors, first: {errors[0]}")
    return [t * 1000 for t in times]


def _steps(timelines: list[list[list]]) -> list[tuple[str, float, float, int]]:
    """(step, median ms from arrival, median ms from the step before, requests
    that had it) in the order of the medians."""
    order: dict[str, list[float]] = {}
    gaps: dict[str, list[float]] = {}
    for timeline in timelines:
        before = 0.0
        for name, at in timeline:
            order.setdefault(name, []).append(at)
            gaps.setdefault(name, []).append(at - before)
            before = at
    rows = [
        (name, statistics.median(ats), statistics.median(gaps[name]), len(ats))
        for name, ats in order.items()
    ]
    return sorted(rows, key=lambda row: row[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="pg", choices=("pg", "embedded"))
    parser.add_argument("--sequential", type=int, default=200)
    parser.add_argument(
        "--warmup", type=int, default=10, help="requests before the timed ones"
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/ballast_bench"
        ),
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/1")
    )
    args = parser.parse_args()
    sigterm_exits()
    print(
        f"machine: {machine_line()}; {args.sequential} sequential streamed requests, "
        f"50 simulated machines; stack {args.stack}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        with bare_side(tmp) as side:
            bare = _ttft(side, tmp, args.sequential, args.warmup)
        with ballast_side(
            args.stack,
            tmp,
            database_url=args.database_url,
            redis_url=args.redis_url,
            app="bench.timeline_asgi:application",
        ) as side:
            httpx.get(side.base + "/bench/timeline", timeout=10)  # forget the warm-up's
            ours = _ttft(side, tmp, args.sequential, args.warmup)
            timelines = httpx.get(side.base + "/bench/timeline", timeout=10).json()
    for name, times in (("bare relay", bare), ("ballast", ours)):
        print(
            f"{name:<12} time to first token p50 {percentile(times, 50):6.2f} ms, "
            f"p99 {percentile(times, 99):6.2f} ms"
        )
    print(
        f"\nballast's steps ({len(timelines)} requests; ms from the request's arrival at the app):"
    )
    print(f"  {'step':<40} {'at (p50)':>9} {'gap (p50)':>10} {'requests':>9}")
    for name, at, gap, count in _steps(timelines[-args.sequential :]):
        print(f"  {name:<40} {at:9.3f} {gap:10.3f} {count:9d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
