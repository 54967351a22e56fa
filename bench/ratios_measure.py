"""``bench/ratios.py``'s three measurements, each through the public contracts
(the renter's HTTP API, the hosts' websockets of ``bench.relay.HostSimProcess``),
the same on the bare relay and on Ballast.

* ``admission``: time to first token of ``n`` streamed requests one after the
  other, the hosts answering each offer at once (the time is all the server's);
* ``relay``: ``bench.relay.run_once`` (streams started, all claimed, then every
  host floods its one-token frames): tokens/s and per-token latency;
* ``short_jobs``: ``clients`` renters each sending non-streamed requests of a
  few tokens back to back for ``seconds``: jobs/s completed and the server's CPU
  per job (user + system, ``/proc``), optionally with a py-spy profile.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from bench.harness import MODEL, cpu_seconds, profile_start, profile_stop
from bench.relay import HostSimProcess, run_once
from bench.renters import chat_body, sse_stream

SHORT_TOKENS = 4  # tokens per short job (and per admission request)


async def _ready(client: httpx.AsyncClient, base: str, key: str, timeout_s: float = 60) -> None:
    """Until a streamed request succeeds (the hosts' heartbeats have landed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = await sse_stream(client, base + "/v1/chat/completions", key, chat_body(16, "ready r0"))
        if not result.error and result.first:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{base}: no answer in {timeout_s} s: {result.error}")
        await asyncio.sleep(0.5)


def ungated(sim: HostSimProcess) -> None:
    """Hosts serve every offer at once, ``SHORT_TOKENS`` one-token frames."""
    sim.configure(0, SHORT_TOKENS, 1, 0.0, gated=False)
    sim.wait_claimed()


async def admission(base: str, key: str, sim: HostSimProcess, n: int, warmup: int = 10):
    """Seconds to the first token of ``n`` sequential streamed requests; (times, errors)."""
    ungated(sim)
    times: list[float] = []
    errors: list[str] = []
    async with httpx.AsyncClient(timeout=60) as client:
        await _ready(client, base, key)
        for i in range(warmup + n):
            result = await sse_stream(client, base + "/v1/chat/completions", key,
                                      chat_body(16, f"admission a{i}"))
            if result.error or not result.first:
                errors.append(result.error or "no token")
            elif i >= warmup:
                times.append(result.first - result.start)
    await asyncio.to_thread(sim.report)  # forget the hosts' send times
    return times, errors


def relay(base: str, key: str, sim: HostSimProcess, pid: int, *, streams: int, frames: int) -> dict:
    """``bench.relay.run_once`` over SSE, one-token frames, flood."""
    return asyncio.run(run_once(base, key, sim, pid, transport="sse", streams=streams, tokens=frames,
                                per_frame=1, pace_s=0.0))


async def short_jobs(base: str, key: str, sim: HostSimProcess, pid: int, *, clients: int,
                     seconds: float, warmup_s: float = 2.0, idle_s: float = 3.0, profile: tuple[str, str] | None = None) -> dict:
    """``clients`` renters sending non-streamed ``SHORT_TOKENS``-token requests back to
    back; the window starts after ``warmup_s``. Returns jobs/s and CPU ms per job in
    the window (all the server's CPU: its background work too), the server's CPU
    ms per s over ``idle_s`` with no request before (its background alone: the
    machines' heartbeats, leases), errors. ``profile``: (directory, name) of a py-spy record of ``pid``
    over the window."""
    ungated(sim)
    url = base + "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {key}"}
    loop = asyncio.get_running_loop()
    window: dict[str, float] = {}
    done: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        await _ready(client, base, key)
        await asyncio.sleep(1.0)  # the last request's end
        cpu0 = cpu_seconds(pid)
        await asyncio.sleep(idle_s)
        idle = (cpu_seconds(pid) - cpu0) / idle_s

        async def renter(c: int) -> None:
            i = 0
            while loop.time() < window.get("end", float("inf")):
                body = {"model": MODEL, "stream": False, "max_tokens": 16,
                        "messages": [{"role": "user", "content": f"short job j{c}n{i}"}]}
                i += 1
                try:
                    resp = await client.post(url, json=body, headers=headers)
                except httpx.HTTPError as exc:  # counted, as a refused request is
                    errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                at = loop.time()
                if resp.status_code != 200 or not resp.json()["choices"][0]["message"]["content"]:
                    errors.append(f"HTTP {resp.status_code}: {resp.text[:200]}")
                else:
                    done.append(at)

        tasks = [asyncio.create_task(renter(c)) for c in range(clients)]
        await asyncio.sleep(warmup_s)
        spy = profile_start(pid, *profile) if profile else None
        cpu0, start = cpu_seconds(pid), loop.time()
        window["end"] = start + seconds
        await asyncio.sleep(seconds)
        cpu = cpu_seconds(pid) - cpu0
        profile_stop(spy)
        await asyncio.gather(*tasks)
    await asyncio.to_thread(sim.report)
    jobs = sum(1 for at in done if start <= at <= start + seconds)
    return {"jobs_s": jobs / seconds, "cpu_ms": cpu * 1000 / max(jobs, 1), "jobs": jobs,
            "idle_ms_s": idle * 1000, "errors": errors}
