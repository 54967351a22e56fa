"""Time from a host's death to the renter's next token, over repeated SIGKILLs.

Usage: ``.venv/bin/python bench/failover.py [--kills 20]``

Starts the platform the way the README does (coordinator, agents) on the embedded
default (or ``DATABASE_URL``/``REDIS_URL`` when set), with scripted agents that
stream a long answer at a steady pace (``--piece-delay`` s per piece). For each
kill: send a streamed request, wait for a few pieces, SIGKILL the agent that is
streaming, and time from the kill to the next piece the renter receives (the
continuation's first token). The killed agent is restarted (same machine token and
key) before the next round. Prints the machine, the settings, median and worst.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ballast.stack import Stack, last_line, manage  # noqa: E402
from bench.common import machine_line  # noqa: E402

MODEL = "smollm2-135m-instruct"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--piece-delay", type=float, default=0.02, help="s between pieces")
    args = parser.parse_args()

    script = json.dumps({"text": " ".join(f"word{i}" for i in range(400)), "delay_s": args.piece_delay})
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, BALLAST_VAR_DIR=tmp, BALLAST_HEARTBEAT_INTERVAL_S="1",
                   DJANGO_SETTINGS_MODULE="ballast.settings")
        if env.get("DATABASE_URL"):
            print("note: using DATABASE_URL as is; point it at a scratch database")
        with Stack(env=env, log_dir=Path(tmp) / "logs") as stack:
            stack.migrate()
            stack.start_coordinator()
            key = last_line(manage("renter_create", "bench@example.com", "--credit", "100", env=env))
            tokens = {f"rig-{i}": last_line(manage("machine_create", "host@example.com", f"rig-{i}", env=env))
                      for i in range(args.agents)}
            agent_args = ("--engine", "scripted", "--script", script)
            for name, token in tokens.items():
                stack.start_agent(name, token, *agent_args)
            stack.wait_for_capacity(key, MODEL, devices=args.agents)

            gaps: list[float] = []
            headers = {"Authorization": f"Bearer {key}"}
            for round_ in range(args.kills):
                with httpx.Client(timeout=60) as client, client.stream(
                    "POST", stack.url + "/v1/chat/completions", headers=headers,
                    json={"model": MODEL, "stream": True, "max_tokens": 400,
                          "messages": [{"role": "user", "content": f"round {round_}"}]},
                ) as response:
                    job_id = response.headers["x-ballast-job-id"]
                    pieces = 0
                    killed_at = None
                    victim = None
                    for line in response.iter_lines():
                        if not line.startswith("data: {"):
                            continue
                        chunk = json.loads(line[6:])
                        if not chunk["choices"] or not chunk["choices"][0]["delta"].get("content"):
                            continue
                        pieces += 1
                        if killed_at is not None:
                            gaps.append(time.perf_counter() - killed_at)
                            break
                        if pieces == 5:
                            job = client.get(f"{stack.url}/v1/jobs/{job_id}", headers=headers).json()
                            victim = job["attempts"][-1]["device"].split("/")[0]
                            killed_at = time.perf_counter()
                            stack.kill(victim, signal.SIGKILL)
                stack.start_agent(victim, tokens[victim], *agent_args)
                stack.wait_for_capacity(key, MODEL, devices=args.agents)

    print(f"machine: {machine_line()}")
    print(f"settings: {args.agents} scripted agents, {args.piece_delay * 1000:.0f} ms between pieces, "
          f"SIGKILL after 5 pieces, database {'DATABASE_URL' if os.environ.get('DATABASE_URL') else 'SQLite'}, "
          f"channel layer {'Redis' if os.environ.get('REDIS_URL') else 'in-memory'}")
    print(f"death -> next token over {len(gaps)} kills: median {statistics.median(gaps) * 1000:.1f} ms, "
          f"worst {max(gaps) * 1000:.1f} ms, best {min(gaps) * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
