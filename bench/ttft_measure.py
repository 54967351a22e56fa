"""``bench/ttft.py``'s measurement loops and the lines that report their figures.

``measure``: one target, warm-up, sequential then concurrent rounds (with the
instrumented coordinator's counters per phase); ``measure_interleaved`` (``--base``):
several targets in one session, interleaved in random order. ``line`` and
``print_added``: p50/p99 in ms, and a Ballast side's added time over the direct side.
"""

from __future__ import annotations

import asyncio
import random

import httpx

from bench.common import percentile
from bench.harness import bench_stats
from bench.renters import chat_body, sse_stream


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
