"""Helpers for tests that drive renters over HTTP and hosts over websockets, and
that open jobs through the request step (``jobs.services.job_open``)."""

from __future__ import annotations

import asyncio
import json

from channels.db import database_sync_to_async
from django.test import AsyncClient

from hosts.models import Device
from jobs.models import Job, SpotCheck
from jobs.requests import completion_request_parse
from jobs.services import api_key_create, job_open
from tests.hostsim import MODEL, HostSim


async def host_online(
    machine_token,
    name: str,
    *,
    score: int | None = None,
    slots: int = 1,
    features: tuple[str, ...] = (),
) -> HostSim:
    """Register a machine, connect its scripted host (declaring ``features``),
    send a heartbeat."""
    machine, token = await database_sync_to_async(machine_token)(name)
    host = HostSim(token, features=features)
    await host.connect()
    await host.heartbeat(slots=slots)
    await heartbeat_applied(machine, slots=slots)
    if score is not None:
        await Device.objects.filter(machine=machine).aupdate(score=score)
    host.machine = machine
    return host


async def heartbeat_applied(machine, *, slots: int = 1, timeout: float = 5.0) -> None:
    """Wait until the coordinator has stored the machine's heartbeat and counts the
    machine live (rule 1): a state, not a sleep."""
    from django.utils import timezone

    from hosts.liveness import live_q
    from hosts.models import DeviceModel

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await DeviceModel.objects.filter(
            live_q(timezone.now(), "device__machine__"),
            device__machine=machine,
            loaded=True,
            device__slots_total=slots,
        ).aexists():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the heartbeat was never applied")


def chat_request(
    api_key: str, *, stream: bool = True, content: str = "Say hello", **extra
) -> asyncio.Task:
    """Start ``POST /v1/chat/completions`` as a task (it resolves at the first event)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
    }
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
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def sse_text(events: list) -> str:
    """The concatenated assistant text of chat chunks."""
    return "".join(
        e["choices"][0]["delta"].get("content", "")
        for e in events
        if e != "[DONE]" and e["choices"]
    )


async def renter_ws(api_key: str, content: str = "Hi"):
    """Open the renter websocket with ``api_key`` and send one chat request."""
    from channels.testing import WebsocketCommunicator

    from ballast.asgi import application

    ws = WebsocketCommunicator(
        application,
        "/ws/v1/chat/",
        headers=[(b"authorization", f"Bearer {api_key}".encode())],
    )
    assert (await ws.connect())[0]
    await ws.send_json_to(
        {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    )
    return ws


def job_queued(renter, model, *, placement: dict | None = None):
    """A queued chat job of ``renter`` for ``model`` (max_tokens 8), through job_create."""
    from jobs.services import job_create

    return job_create(
        renter=renter,
        api_key=None,
        model=model,
        endpoint="chat",
        messages=[{"role": "user", "content": "hi"}],
        prompt=None,
        params={"max_tokens": 8},
        placement=placement or {},
        stream=False,
    )


def sessions_waiting_on_locks(count: int = 1, timeout_s: float = 10.0) -> None:
    """Wait until ``count`` sessions of this database wait on a row lock
    (PostgreSQL; a state, polled, not a sleep)."""
    import time

    from django.db import connection

    deadline = time.monotonic() + timeout_s
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0] >= count:
                return
            time.sleep(0.005)
    raise AssertionError(f"{count} session(s) never waited on a lock")


async def job_closed(job_id, *, timeout: float = 5.0):
    """Wait until the job is closed (a state, polled); return it with its attempts."""
    from jobs.models import Job

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        job = await Job.objects.filter(id=job_id).afirst()
        if job is not None and job.status not in Job.OPEN_STATUSES:
            return job
        await asyncio.sleep(0.01)
    raise AssertionError(f"job {job_id} never closed")


async def right_answer(offer: dict) -> str:
    """What an honest host running the reference model answers to a spot check's
    offer, in a sentence (the test reads the pool for it: the stand-in for the
    model, as ``tests.conftest.oracle_answer`` is in calibration)."""
    check = await SpotCheck.objects.select_related("canary").aget(
        job__attempts__id=offer["job"]
    )
    return f"Sure! It is {check.canary.expected}."


async def verdict(offer_job: str) -> SpotCheck:
    """Wait (on the database state) until the spot check of this attempt is judged."""
    for _ in range(500):
        check = await SpotCheck.objects.filter(job__attempts__id=offer_job).afirst()
        if check is not None and check.passed is not None:
            return check
        await asyncio.sleep(0.02)
    raise AssertionError("spot check never judged")


def request_parsed(
    max_tokens: int = 16, model: str | None = None, content: str = "Hi"
):
    """A one-message chat request for the reference model (or ``model``), as
    ``jobs.requests.completion_request_parse`` admits it."""
    from tests.conftest import REFERENCE_MODEL

    return completion_request_parse(
        {
            "model": model or REFERENCE_MODEL["id"],
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
        },
        endpoint=Job.Endpoint.CHAT,
    )


def key_of(user) -> str:
    """A new plain API key of ``user``."""
    return api_key_create(user=user)[1]


def open_job(key, **kwargs):
    """``jobs.services.job_open`` of ``request_parsed(**kwargs)`` with the plain
    API key ``key``: (job, its catalog model, the dispatch)."""
    return job_open(
        api_key=key, request=request_parsed(**kwargs), waiting_channel="w.1"
    )
