"""Helpers for tests that drive renters over HTTP and hosts over websockets."""

from __future__ import annotations

import asyncio
import json

from channels.db import database_sync_to_async
from django.test import AsyncClient

from hosts.models import Device
from tests.hostsim import MODEL, HostSim


async def host_online(machine_token, name: str, *, score: int | None = None, slots: int = 1) -> HostSim:
    """Register a machine, connect its scripted host, send a heartbeat."""
    machine, token = await database_sync_to_async(machine_token)(name)
    host = HostSim(token)
    await host.connect()
    await host.heartbeat(slots=slots)
    if score is not None:
        await Device.objects.filter(machine=machine).aupdate(score=score)
    host.machine = machine
    return host


def chat_request(api_key: str, *, stream: bool = True, content: str = "Say hello", **extra) -> asyncio.Task:
    """Start ``POST /v1/chat/completions`` as a task (it resolves at the first event)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": stream}
    body.update(extra)
    return asyncio.create_task(
        AsyncClient().post(
            "/v1/chat/completions",
            data=body,
            content_type="application/json",
            headers={"authorization": f"Bearer {api_key}"},
        )
    )


async def read_body(response) -> bytes:
    """Consume a streamed response to its end."""
    chunks = []
    async for chunk in response.streaming_content:
        chunks.append(chunk)
    return b"".join(chunks)


def sse_events(body: bytes) -> list:
    """The ``data:`` payloads of a server-sent event stream (JSON, or "[DONE]")."""
    out = []
    for block in body.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def sse_text(events: list) -> str:
    """The concatenated assistant text of chat chunks."""
    return "".join(
        e["choices"][0]["delta"].get("content", "")
        for e in events
        if e != "[DONE]" and e["choices"]
    )
