"""Findings of a hostile walk-through, each kept as the failing input (a regression
test per bug): hosts' frames that must be refused (the connection kept, or the
attempt failed), and what must not happen to the fleet."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.db import database_sync_to_async

from hosts.models import Benchmark, Device, FailedCapability
from jobs.models import Attempt
from jobs.tokens import prompt_token_count
from tests.hostsim import MODEL, HostSim

from .helpers import chat_request, host_online

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_when_every_capable_device_failed_it_answers_502_at_once(
    catalog, api_key, machine_token, settings
):
    settings.BALLAST_QUEUE_TIMEOUT_S = 60  # a wait would show as a test timeout
    hosts = [
        await host_online(machine_token, f"bad{i}", score=90 - i) for i in range(2)
    ]
    request = chat_request(api_key)
    for host in hosts:
        offer = await host.recv_type("offer")
        await host.send({"type": "error", "job": offer["job"], "message": "boom"})
    response = await asyncio.wait_for(request, 5)
    assert response.status_code == 502
    assert json.loads(response.content)["error"]["code"] == "all_attempts_failed"
    for host in hosts:
        await host.close()


@pytest.mark.parametrize(
    "frame",
    [
        {
            "type": "heartbeat",
            "devices": [{"index": 2**70, "temp_c": 50, "vram_free_mb": 1, "slots": 1}],
        },
        {
            "type": "heartbeat",
            "devices": [{"index": 0, "temp_c": 50, "vram_free_mb": 2**31, "slots": 1}],
        },
        {
            "type": "benchmark",
            "device": 0,
            "model": MODEL,
            "tokens_per_s": float("nan"),
            "ttft_ms": 1,
        },
        {
            "type": "benchmark",
            "device": 0,
            "model": MODEL,
            "tokens_per_s": float("inf"),
            "ttft_ms": 1,
        },
        {
            "type": "benchmark",
            "device": 0,
            "model": "not-in-catalog",
            "tokens_per_s": 1,
            "ttft_ms": 1,
        },
        {
            "type": "model_load_failed",
            "device": 0,
            "model": "not-in-catalog",
            "error": "x",
        },
    ],
    ids=[
        "index 2**70",
        "vram 2**31",
        "NaN",
        "Infinity",
        "benchmark unknown model",
        "load_failed unknown model",
    ],
)
async def test_out_of_range_host_frames_get_an_error_and_keep_the_connection(
    catalog, machine_token, frame
):
    host = await host_online(machine_token, "rig")
    await host.ws.send_to(text_data=json.dumps(frame, allow_nan=True))
    error = await host.recv_type("error")
    assert error["message"].startswith(frame["type"])
    await host.heartbeat()  # still served
    assert (
        not await Benchmark.objects.aexists()
        and not await FailedCapability.objects.aexists()
    )
    await host.close()


async def test_a_lone_surrogate_token_is_refused_and_fails_its_attempt(
    catalog, api_key, machine_token
):
    """A malformed frame for an open attempt is refused and ends that attempt as
    the host's error (DESIGN.md "Money": no free refusal); with no other device
    the renter gets a clean 502, never a coordinator error."""
    host = await host_online(machine_token, "rig")
    request = chat_request(api_key)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.ws.send_to(
        text_data=json.dumps(
            {"type": "token", "job": offer["job"], "text": "ok \ud800 bad"}
        )
    )
    assert "not valid UTF-8" in (await host.recv_type("error"))["message"]
    assert (await host.recv_type("cancel"))["job"] == offer["job"]
    response = await request
    assert response.status_code == 502
    attempt = await Attempt.objects.aget(id=offer["job"])
    assert attempt.outcome == Attempt.Outcome.HOST_ERROR
    await host.close()


async def test_a_second_connection_of_a_machine_replaces_the_first(
    catalog, machine_token
):
    first = await host_online(machine_token, "rig")
    second = HostSim(first.machine_token)
    second.key = first.key
    await second.connect()
    error = await first.recv_type("error")
    assert "took over" in error["message"]
    assert (await first.ws.receive_output(timeout=2))["type"] == "websocket.close"
    await second.heartbeat()
    device = await Device.objects.select_related("machine").aget(machine=first.machine)
    assert device.machine.connected
    await second.close()


async def test_a_host_cannot_grow_its_benchmarks_without_end(catalog, machine_token):
    host = await host_online(machine_token, "rig")
    for i in range(25):
        await host.send(
            {
                "type": "benchmark",
                "device": 0,
                "model": MODEL,
                "tokens_per_s": i,
                "ttft_ms": 1,
            }
        )
    await host.send({"type": "nonsense"})  # frames are handled in order: this one last
    await host.recv_type("error")
    assert await Benchmark.objects.acount() == 20
    newest = await Benchmark.objects.order_by("-measured_at", "-id").afirst()
    assert newest.tokens_per_s == 24
    await host.close()


async def test_a_nul_in_a_token_is_refused_and_fails_its_attempt(
    catalog, api_key, machine_token
):
    """(The agent drops NULs before sending: agent.outbox.sendable.)"""
    host = await host_online(machine_token, "rig")
    request = chat_request(api_key, stream=False)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.send({"type": "token", "job": offer["job"], "text": "fi\u0000ne"})
    assert "NUL" in (await host.recv_type("error"))["message"]
    assert (await request).status_code == 502
    attempt = await Attempt.objects.aget(id=offer["job"])
    assert attempt.outcome == Attempt.Outcome.HOST_ERROR
    await host.close()


async def test_the_frame_bound_counts_bytes_not_characters(catalog, machine_token):
    """256 KiB of UTF-8 on the wire: 200,000 two-byte characters (400 KB) are
    refused as a 300 KB ASCII frame is."""
    host = await host_online(machine_token, "rig")
    await host.ws.send_to(
        text_data=json.dumps({"type": "heartbeat", "devices": [], "pad": "é" * 200_000})
    )
    assert "256 KiB" in (await host.recv_type("error"))["message"]
    await host.close()


async def test_a_prompt_count_no_prompt_can_have_is_not_shown_to_the_renter(
    catalog, api_key, machine_token
):
    """``usage.prompt_tokens`` is the host's report only within what the
    prompt's bytes allow (``prompt_tokens_most``); past it, the coordinator's
    own count (fresh-eyes review 3: a host's 2,147,483,647 reached the
    renter)."""
    host = await host_online(machine_token, "rig")
    request = chat_request(api_key, stream=False)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], "Hello")
    await host.send(
        {
            "type": "done",
            "job": offer["job"],
            "finish_reason": "stop",
            "usage": {"prompt_tokens": 2**31 - 1, "completion_tokens": 1},
            "receipt": host.receipt(offer["job"], 1),
        }
    )
    response = await request
    assert response.status_code == 200
    usage = json.loads(response.content)["usage"]
    counted = await database_sync_to_async(prompt_token_count)(
        MODEL, [{"role": "user", "content": "Say hello"}], None
    )
    assert usage["prompt_tokens"] == counted, usage
    await host.close()
