"""The chaos run's renters: requests through the load balancer, each recorded as
the renter saw it (a ``Record``), never from the coordinator's own state.

Kinds: ``http_stream`` (chat, server-sent events), ``http`` (chat, whole),
``completion`` (``/v1/completions``, streamed), ``ws`` (the renter websocket),
``disconnect`` (a streamed chat whose renter goes away after a few pieces).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

import httpx
import websockets

KINDS = ("http_stream", "http", "completion", "ws", "disconnect")
DISCONNECT_AFTER = 3  # pieces a disconnecting renter reads before it goes


@dataclass
class Record:
    """One request as its renter saw it.

    ``status``: the HTTP status (or the websocket error's), 0 when none came;
    ``text``: every piece received, in order; ``finish_reason``: of the last
    chunk ("error" for an in-band error); ``error_code``: the error's code;
    ``cut``: the connection broke before the answer ended; ``retry_after``: the
    header of a 503/429; ``coordinator``: the backend that answered (HAProxy's
    header); times are ``time.time()`` seconds.
    """

    index: int
    renter: int
    kind: str
    model: str
    prompt: str
    max_tokens: int
    status: int = 0
    text: str = ""
    finish_reason: str = ""
    error_code: str = ""
    cut: str = ""
    retry_after: str = ""
    job: str = ""
    coordinator: str = ""
    started: float = field(default_factory=time.time)
    ended: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def _body(record: Record) -> dict:
    base = {"model": record.model, "max_tokens": record.max_tokens}
    if record.kind == "completion":
        return {**base, "prompt": record.prompt, "stream": True}
    messages = [{"role": "user", "content": record.prompt}]
    return {**base, "messages": messages, "stream": record.kind != "http"}


def _piece(chunk: dict) -> str:
    choice = chunk["choices"][0] if chunk.get("choices") else {}
    return (choice.get("delta") or {}).get("content") or choice.get("text") or ""


def _chunk_take(record: Record, chunk: dict) -> None:
    """Add one chunk (SSE or websocket) to ``record``."""
    record.text += _piece(chunk)
    choice = chunk["choices"][0] if chunk.get("choices") else {}
    if choice.get("finish_reason"):
        record.finish_reason = choice["finish_reason"]
    if chunk.get("error"):
        record.error_code = chunk["error"].get("code") or "error"


async def _http(client: httpx.AsyncClient, base: str, key: str, record: Record) -> None:
    path = "/v1/completions" if record.kind == "completion" else "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {key}"}
    body = _body(record)
    async with client.stream(
        "POST", base + path, headers=headers, json=body
    ) as response:
        record.status = response.status_code
        record.job = response.headers.get("x-ballast-job-id", "")
        record.coordinator = response.headers.get("x-ballast-coordinator", "")
        record.retry_after = response.headers.get("retry-after", "")
        if response.status_code != 200 or not body["stream"]:
            raw = await response.aread()
            answer = json.loads(raw)
            if response.status_code != 200:
                record.error_code = answer["error"]["code"]
                return
            choice = answer["choices"][0]
            record.text = choice["message"]["content"]
            record.finish_reason = choice["finish_reason"]
            if answer.get("error"):
                record.error_code = answer["error"].get("code") or "error"
            return
        pieces = 0
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                return
            if not line.startswith("data: "):
                continue
            _chunk_take(record, json.loads(line[6:]))
            pieces += 1
            if record.kind == "disconnect" and pieces >= DISCONNECT_AFTER:
                record.cut = "renter disconnected"
                return  # leaving the block closes the connection mid-stream
        if not record.finish_reason:
            record.cut = "the stream ended without [DONE]"


async def _ws(base: str, key: str, record: Record) -> None:
    url = base.replace("http://", "ws://") + "/ws/v1/chat/"
    async with websockets.connect(
        url, additional_headers={"Authorization": f"Bearer {key}"}, open_timeout=30
    ) as ws:
        record.coordinator = ws.response.headers.get("x-ballast-coordinator", "")
        await ws.send(
            json.dumps({k: v for k, v in _body(record).items() if k != "stream"})
        )
        async for raw in ws:
            message = json.loads(raw)
            kind = message.get("type")
            if kind == "error":
                record.status = message.get("status", 0)
                record.job = message.get("job", "")
                record.error_code = message["error"]["code"]
                return
            if kind == "done":
                record.status = 200
                record.job = message.get("job", "")
                record.finish_reason = message.get("finish_reason", "")
                return
            _chunk_take(record, message)
        record.cut = "the websocket closed before done"


async def request_send(
    base: str, key: str, record: Record, client: httpx.AsyncClient
) -> Record:
    """Send ``record``'s request to ``base`` with ``key``; fill in what came back.
    A broken connection is recorded in ``cut``, never raised."""
    try:
        if record.kind == "ws":
            await _ws(base, key, record)
        else:
            await _http(client, base, key, record)
    except (
        httpx.HTTPError,
        websockets.WebSocketException,
        OSError,
        ValueError,
        KeyError,
    ) as exc:
        record.cut = record.cut or f"{type(exc).__name__}: {exc}"[:300]
    record.ended = time.time()
    return record


async def load_run(
    base: str, keys: list[str], records: list[Record], concurrency: int, progress
) -> None:
    """Send every record's request, ``concurrency`` at a time; ``progress()``
    is called after each one ends."""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120), limits=limits) as client:

        async def one(record: Record) -> None:
            async with gate:
                record.started = time.time()
                await request_send(base, keys[record.renter], record, client)
                progress()

        await asyncio.gather(*(one(record) for record in records))
