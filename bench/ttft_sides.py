"""``bench/ttft.py``'s two sides and how they start.

* the direct side: ``direct_app``, the same ``ScriptedEngine`` and script
  (``SCRIPT``, or ``BENCH_SCRIPT``'s JSON) behind a bare ASGI app, served by
  ``uvicorn_start("bench.ttft_sides:direct_app", ...)``; ``wait_http`` waits for
  a server's answer;
* the Ballast side: ``ballast_start`` (migrate, the coordinator, scripted agents
  online, a renter's key) and ``renter_keys`` (more renters with credit).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ballast.stack import UVICORN_FLAGS, manage
from bench.harness import MODEL, ROOT, coordinator_start, machines_bulk, renter_key

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


def ballast_start(stack, db: str, env: dict, args, script: str, *, prefix: str,
                  instrumented: bool, root: Path | None = None) -> str:
    """Migrate, start the coordinator and ``args.agents`` scripted agents of ``stack``
    (on the scratch database ``db``) and wait until they are online; return a
    renter's API key (made by the checkout at ``root``, default this one)."""
    # DEBUG off serves the collected files only: a fresh worktree (``--base``)
    # has none, and its pages would fail on the first one they name
    manage("collectstatic", "--noinput", "-v0", env=env, root=root or ROOT)
    stack.migrate()
    coordinator_start(stack, instrumented=instrumented)
    key = renter_key(env, root)
    tokens = machines_bulk(db, args.agents, prefix=prefix)
    for i, token in enumerate(tokens):
        stack.start_agent(f"agent-{i}", token, "--engine", "scripted", "--script", script,
                          "--slots", str(args.slots), "--name", "Bench GPU")
    stack.wait_for_capacity(key, MODEL, devices=args.agents)
    return key
