"""Pieces the process-level benchmarks share (ttft, relay, heartbeats).

* ``coordinator_env``: the environment of a coordinator on a scratch PostgreSQL
  database and a chosen channel layer (``inmem``, ``pubsub``, ``core``);
* ``machines_bulk``: many machines registered in one SQL statement, tokens known;
* ``FastHost``: a simulated machine speaking ``ballast.host.v1`` over a real
  websocket, claiming every offer and pushing tokens as fast as asked. Every token
  is ``WORD`` (one model token: the coordinator's ``max_tokens`` cut and token
  recount see exactly one token per token); the host keeps each token's send time
  beside the text (``FastHost.sent``: stream id -> ``perf_counter_ns`` per token,
  CLOCK_MONOTONIC: comparable across processes on one machine). The stream id is
  the last word of the renter's prompt, which the offer carries. Receipts are real
  Ed25519 signatures;
* renter clients over SSE and over the renter websocket;
* ``cpu_seconds``: user+system CPU of a process, to report CPU per request/token.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import secrets
import time
from pathlib import Path

import httpx

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


# --- the simulated host ---------------------------------------------------------------
class FastHost:
    """One simulated machine (one device, ``slots`` slots) over a real websocket.

    Claims every offer at once. ``gate`` (an asyncio.Event) holds token pushing
    until set (so a run can start all its streams first); each offer then gets
    ``tokens`` tokens (``WORD`` each) in frames of ``per_frame`` tokens, ``pace_s``
    apart (0: as fast as the socket takes them), then ``done``. The send time of
    every token (ns, ``perf_counter_ns``; the tokens of one frame share it) is kept in
    ``sent[stream id]``, the stream id being the last word of the offer's prompt: the
    renter's k-th token is the host's k-th, so latency = receipt − ``sent[id][k]``.
    """

    def __init__(self, ws_url: str, token: str, *, slots: int, tokens: int = 10,
                 per_frame: int = 1, pace_s: float = 0.0, gate: asyncio.Event | None = None):
        self.ws_url = ws_url
        self.token = token
        self.slots = slots
        self.tokens = tokens
        self.per_frame = per_frame
        self.pace_s = pace_s
        self.gate = gate
        self.offers = 0
        self.sent: dict[str, list[int]] = {}
        self.claimed = asyncio.Event()
        self.ws = None
        self.tasks: set[asyncio.Task] = set()
        self._lock = asyncio.Lock()
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        # Derived from the token: the same machine keeps its pinned key across runs.
        self.key = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(token.encode()).digest())

    @property
    def public_key(self) -> str:
        import base64

        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        raw = self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return base64.b64encode(raw).decode()

    def receipt(self, job: str, tokens: int, text: str) -> str:
        """A real receipt (PROTOCOL.md §2), so the coordinator's check does its full work."""
        import base64

        digest = hashlib.sha256(text.encode()).hexdigest()
        message = f"ballast-receipt/v1\n{job}\n{tokens}\n{digest}".encode()
        return base64.b64encode(self.key.sign(message)).decode()

    async def send(self, frame: dict) -> None:
        async with self._lock:
            await self.ws.send(json.dumps(frame))

    def heartbeat_frame(self) -> dict:
        return {"type": "heartbeat", "paused": False, "devices": [
            {"index": 0, "temp_c": 50, "vram_free_mb": 20000, "loaded_models": [MODEL],
             "slots": self.slots}]}

    async def connect(self) -> None:
        from websockets.asyncio.client import connect

        self.ws = await connect(self.ws_url, additional_headers={"Authorization": f"Bearer {self.token}"},
                                subprotocols=["ballast.host.v1"], max_size=None, open_timeout=60)
        nonce = json.loads(await self.ws.recv())["nonce"]  # the challenge
        proof = self.key.sign(f"ballast-hello/v1\n{nonce}\n{self.public_key}".encode())
        await self.send({"type": "hello", "agent_version": "bench-1",
                         "engine": {"name": "benchsim", "version": "1"},
                         "public_key": self.public_key, "accepts_serverless": True,
                         "proof": base64.b64encode(proof).decode(),
                         "devices": [{"index": 0, "name": "Bench GPU", "vram_total_mb": 24576}]})
        while json.loads(await self.ws.recv())["type"] != "welcome":
            pass
        await self.send(self.heartbeat_frame())
        self.tasks.add(asyncio.create_task(self._serve()))
        self.tasks.add(asyncio.create_task(self._heartbeats()))

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(5)
            await self.send(self.heartbeat_frame())

    async def _serve(self) -> None:
        async for raw in self.ws:
            frame = json.loads(raw)
            if frame["type"] == "offer":
                self.offers += 1
                task = asyncio.create_task(self._job(frame["job"], stream_id(frame)))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def _job(self, job: str, stream: str) -> None:
        await self.send({"type": "claim", "job": job})
        if self.gate is not None:
            await self.gate.wait()
        sent = 0
        pieces: list[str] = []
        times = self.sent.setdefault(stream, [])
        while sent < self.tokens:
            n = min(self.per_frame, self.tokens - sent)
            text = WORD * n
            pieces.append(text)
            times.extend([now_ns()] * n)
            await self.send({"type": "token", "job": job, "text": text})
            sent += n
            if self.pace_s:
                await asyncio.sleep(self.pace_s)
        await self.send({"type": "done", "job": job, "finish_reason": "stop",
                         "usage": {"prompt_tokens": 1, "completion_tokens": sent},
                         "receipt": self.receipt(job, sent, "".join(pieces))})

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        if self.ws is not None:
            await self.ws.close()


def stream_id(offer: dict) -> str:
    """The stream id of an offer: the last word of its (last) prompt message."""
    messages = offer.get("messages") or [{"content": offer.get("prompt", "")}]
    words = str(messages[-1].get("content", "")).split()
    return words[-1] if words else ""


# --- renter clients ---------------------------------------------------------------------
class StreamResult:
    """What a renter saw of one stream: timings (perf_counter s) and token arrivals.

    ``arrivals`` holds one ``perf_counter_ns`` per token received (a chunk of k
    ``WORD``s counts k tokens, all arrived with the chunk; any other text counts 1).
    """

    def __init__(self, stream: str = "") -> None:
        self.stream = stream
        self.start = 0.0
        self.first = 0.0
        self.end = 0.0
        self.tokens = 0
        self.arrivals: list[int] = []
        self.error = ""

    def text_seen(self, text: str, at_ns: int) -> None:
        n = text.count(WORD) or (1 if text else 0)
        self.tokens += n
        self.arrivals.extend([at_ns] * n)

    def latencies(self, sent_ns: list[int]) -> list[float]:
        """Seconds from the host's send of token k to its arrival here, for every k."""
        return [(a - s) / 1e9 for a, s in zip(self.arrivals, sent_ns, strict=False)]


def chat_body(max_tokens: int = 1900, content: str = "hello") -> dict:
    return {"model": MODEL, "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": content}]}


async def sse_stream(client: httpx.AsyncClient, url: str, key: str, body: dict) -> StreamResult:
    """POST a streamed completion and read its server-sent events to ``[DONE]``."""
    result = StreamResult(stream_id(body))
    result.start = time.perf_counter()
    async with client.stream("POST", url, json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
        if resp.status_code != 200:
            result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
            result.end = time.perf_counter()
            return result
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            at = now_ns()
            payload = line[6:]
            if payload == "[DONE]":
                continue  # read on to the response's end, as clients do: the connection is reused
            chunk = json.loads(payload)
            choices = chunk.get("choices") or []
            if not choices:
                continue
            choice = choices[0]
            text = choice.get("delta", {}).get("content") if "delta" in choice else choice.get("text")
            if text:
                if not result.first:
                    result.first = time.perf_counter()
                result.text_seen(text, at)
            if choice.get("finish_reason") == "error":
                result.error = json.dumps(chunk.get("error"))[:200]
    result.end = time.perf_counter()
    return result


async def ws_stream(ws_url: str, key: str, body: dict) -> StreamResult:
    """Send one request on the renter websocket and read chunks until ``done``."""
    from websockets.asyncio.client import connect

    result = StreamResult(stream_id(body))
    result.start = time.perf_counter()
    async with connect(ws_url, additional_headers={"Authorization": f"Bearer {key}"},
                       max_size=None, open_timeout=60) as ws:
        await ws.send(json.dumps(body))
        async for raw in ws:
            at = now_ns()
            message = json.loads(raw)
            if message.get("type") in ("done", "error"):
                if message.get("type") == "error":
                    result.error = json.dumps(message)[:200]
                break
            choices = message.get("choices") or []
            text = choices[0].get("delta", {}).get("content") if choices else None
            if text:
                if not result.first:
                    result.first = time.perf_counter()
                result.text_seen(text, at)
    result.end = time.perf_counter()
    return result


def renter_key(env: dict[str, str], root: Path | None = None) -> str:
    """A renter with credit, made by the checkout at ``root`` (default: this one); its key."""
    from ballast.stack import ROOT, last_line, manage

    return last_line(manage("renter_create", "renter@example.com", "--credit", "1000000", env=env,
                            root=root or ROOT))


# --- the coordinator process --------------------------------------------------------------
def coordinator_start(stack, *, instrumented: bool = True, port: int = 0, name: str = "coordinator") -> str:
    """Start a coordinator like ``Stack.start_coordinator`` does (same uvicorn flags).

    ``instrumented`` serves ``bench.instrumented_asgi:application`` (the same app with
    call/query counters at ``/bench/stats``) instead of ``ballast.asgi:application``.
    """
    import sys

    from ballast.stack import UVICORN_FLAGS, port_free

    app = "bench.instrumented_asgi:application" if instrumented else "ballast.asgi:application"
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
