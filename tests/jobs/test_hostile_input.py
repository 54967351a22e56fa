"""Findings of a hostile walk-through, each kept as the failing input (a regression
test per bug): renters' requests that must be refused, hosts' frames that must be
refused, and what must not happen to the money or the fleet."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient

from billing.models import Earning
from billing.money import usd_to_nano
from billing.services import renter_top_up
from hosts.models import Benchmark, Device, FailedCapability
from jobs.models import Attempt, Job
from jobs.tokens import token_count
from tests.hostsim import MODEL, HostSim

from .helpers import chat_request, host_online, read_body, sse_events, sse_text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_a_prompt_longer_than_the_context_is_a_400_and_costs_no_host_anything(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "rig")
    response = await chat_request(api_key, content="word " * 2100, max_tokens=1)
    assert response.status_code == 400
    body = json.loads(response.content)
    assert body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["param"] == "messages"
    assert await host.ws.receive_nothing(timeout=0.2), "never offered to a host"
    assert not await Attempt.objects.aexists()
    await host.close()


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


async def test_a_host_cannot_send_or_bill_past_max_tokens(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "rig")
    request = chat_request(api_key, stream=False, max_tokens=20)
    offer = await host.recv_type("offer")
    await host.answer(offer, ["x" * 500], tokens=500)
    response = await request
    body = json.loads(response.content)
    assert body["choices"][0]["finish_reason"] == "length"
    text = body["choices"][0]["message"]["content"]
    assert 0 < token_count(MODEL, text) <= 20, "the renter never receives more"
    assert (await host.recv_type("cancel"))["job"] == offer["job"]
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert job.tokens_billed <= 20
    assert job.cost_nano <= 20 * catalog.price_completion_nano
    attempt = await Attempt.objects.aget(job=job)
    assert attempt.receipt_valid is not True, (
        "a host that ignores max_tokens is not paid"
    )
    assert not await Earning.objects.filter(attempt=attempt).aexists()
    await host.close()


async def test_parallel_requests_cannot_overspend_the_credit(catalog, machine_token):
    from hosts.services import user_get_or_create
    from jobs.services import api_key_create

    user = await database_sync_to_async(user_get_or_create)(email="tiny@example.com")
    await database_sync_to_async(renter_top_up)(
        user=user, amount_nano=usd_to_nano("0.000001"), key="tiny"
    )  # enough for 5 tokens at 200 nano-USD
    _, key = await database_sync_to_async(api_key_create)(user=user)
    host = await host_online(machine_token, "rig", slots=8)
    first = chat_request(key, stream=False, max_tokens=5)
    offer = await host.recv_type(
        "offer"
    )  # the first job is running, its worst case reserved
    second = await chat_request(key, stream=False, max_tokens=5)
    assert second.status_code == 402
    await host.answer(offer, ["ok"])
    assert (await first).status_code == 200
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


async def test_unknown_v1_paths_and_big_bodies_answer_openai_shaped_json(
    catalog, api_key
):
    client = AsyncClient()
    auth = {"authorization": f"Bearer {api_key}"}
    for path, message in (
        ("/v1/embeddings", "no such API endpoint: GET /v1/embeddings"),
        ("/v1/jobs/xyz", "no such job: xyz"),
        ("/v1/rentals/xyz", "no such rental: xyz"),
        (f"/v1/jobs/{uuid.uuid4()}", "no such job"),
    ):
        response = await client.get(path, headers=auth)
        assert response.status_code == 404
        error = json.loads(response.content)["error"]
        assert error["code"] == "not_found" and error["message"].startswith(message)
    response = await client.get(f"/v1/models/{MODEL}", headers=auth)
    assert json.loads(response.content)["id"] == MODEL
    response = await client.post(
        "/v1/chat/completions",
        data=b'{"model": "' + b"x" * (11 * 1024 * 1024) + b'"}',
        content_type="application/json",
        headers=auth,
    )
    assert response.status_code == 413
    assert json.loads(response.content)["error"]["code"] == "body_too_large"


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


@pytest.mark.parametrize(
    "content, needle", [("hi\u0000there", "NUL"), ("hi \ud800", "not valid UTF-8")]
)
async def test_unstorable_text_in_a_request_is_a_400(catalog, api_key, content, needle):
    response = await chat_request(api_key, content=content)
    assert response.status_code == 400
    body = json.loads(response.content)
    assert (
        needle in body["error"]["message"]
        and body["error"]["param"] == "messages[0].content"
    )


async def test_deeply_nested_json_is_refused_cleanly(catalog, api_key, machine_token):
    deep = '{"model": "x", "messages": ' + "[" * 50000 + "]" * 50000 + "}"
    response = await AsyncClient().post(
        "/v1/chat/completions",
        data=deep,
        content_type="application/json",
        headers={"authorization": f"Bearer {api_key}"},
    )
    assert response.status_code == 400
    host = await host_online(machine_token, "rig")
    await host.ws.send_to(text_data="[" * 100000 + "]" * 100000)
    assert (await host.recv_type("error"))["message"] == "frame is not valid JSON"
    await host.heartbeat()  # the connection is still served
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


async def test_a_price_change_mid_answer_charges_the_price_the_job_was_admitted_at(
    catalog, machine_token
):
    """Credit for exactly the worst case at the old price; the price rises 500×
    while the answer streams: the renter is charged the admitted price, never
    overdrawn (before: the catalog's price at the end, a balance of −800,000)."""
    from billing.models import Account
    from catalog.models import CatalogModel
    from hosts.services import user_get_or_create
    from jobs.services import api_key_create

    user = await database_sync_to_async(user_get_or_create)(email="exact@example.com")
    await database_sync_to_async(renter_top_up)(
        user=user, amount_nano=1000 * 200, key="exact"
    )  # max_tokens 1000 at 200 nano-USD
    _, key = await database_sync_to_async(api_key_create)(user=user)
    host = await host_online(machine_token, "rig")
    request = chat_request(key, stream=False, max_tokens=1000)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], " the the")
    await CatalogModel.objects.filter(id=catalog.id).aupdate(
        price_completion_nano=100_000
    )
    await host.token(offer["job"], " the")
    await host.done(offer["job"], 3)
    response = await request
    assert response.status_code == 200
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert job.price_completion_nano == 200
    assert job.cost_nano == job.tokens_billed * 200 > 0
    account = await Account.objects.aget(user=user, kind=Account.Kind.RENTER_CREDIT)
    assert account.balance_nano == 1000 * 200 - job.cost_nano >= 0
    await host.close()


async def test_a_lost_database_connection_at_the_end_of_an_answer_is_retried(
    catalog, api_key, machine_token, monkeypatch
):
    """The end of a job whose connection the server closed runs once more: the
    renter gets the whole answer and ``[DONE]``, and is billed once."""
    from django.db import OperationalError

    from billing.models import LedgerTransaction
    from jobs import services

    real_succeed = services.job_succeed
    failures = []

    def succeed_after_a_lost_connection(**kwargs):
        if not failures:
            failures.append(1)
            raise OperationalError(
                "consuming input failed: server closed the connection"
            )
        return real_succeed(**kwargs)

    succeed_after_a_lost_connection.__name__ = "job_succeed"
    monkeypatch.setattr(services, "job_succeed", succeed_after_a_lost_connection)
    host = await host_online(machine_token, "rig")
    request = chat_request(api_key)
    offer = await host.recv_type("offer")
    await host.answer(offer, ["Hello", " there."])
    response = await request
    events = sse_events(await read_body(response))
    assert sse_text(events) == "Hello there." and events[-1] == "[DONE]"
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert failures and job.status == Job.Status.SUCCEEDED and job.cost_nano > 0
    assert await LedgerTransaction.objects.filter(job=job).acount() == 1
    await host.close()


async def test_json_nested_past_the_recursion_limit_is_a_400_on_every_api(
    catalog, api_key
):
    """``[[[[…]]]]`` 100,000 deep: the DRF APIs answered a 500 (RecursionError),
    the completions a 400 (found by a fresh-eyes check)."""
    client = AsyncClient()
    auth = {"authorization": f"Bearer {api_key}"}
    deep = b"[" * 100_000 + b"]" * 100_000
    for path in ("/v1/rentals", "/v1/chat/completions"):
        response = await client.post(
            path, data=deep, content_type="application/json", headers=auth
        )
        assert response.status_code == 400, (path, response.content[:200])
        assert json.loads(response.content)["error"]["type"] == "invalid_request_error"


async def test_the_frame_bound_counts_bytes_not_characters(catalog, machine_token):
    """256 KiB of UTF-8 on the wire: 200,000 two-byte characters (400 KB) are
    refused as a 300 KB ASCII frame is."""
    host = await host_online(machine_token, "rig")
    await host.ws.send_to(
        text_data=json.dumps({"type": "heartbeat", "devices": [], "pad": "é" * 200_000})
    )
    assert "256 KiB" in (await host.recv_type("error"))["message"]
    await host.close()


async def test_what_the_schema_fuzzer_found_is_answered_as_documented(catalog, api_key):
    """Found by schemathesis (tests/fuzz): a ``/v1/`` path with a newline was
    Django's HTML 404 (``.*`` stops at one); a form body to ``/v1/rentals`` was
    parsed into strings and answered as a bad device (now 415: the API takes
    JSON); ``"role": {}`` was a 500 (TypeError)."""
    client = AsyncClient()
    auth = {"authorization": f"Bearer {api_key}"}
    response = await client.get("/v1/models/x%0A", headers=auth)
    assert (
        response.status_code == 404 and response["content-type"] == "application/json"
    )
    assert json.loads(response.content)["error"]["code"] == "not_found"
    response = await client.post(
        "/v1/rentals", data={"device": "1", "hours": "1"}, headers=auth
    )
    assert response.status_code == 415
    assert json.loads(response.content)["error"]["type"] == "invalid_request_error"
    response = await client.post(
        "/v1/chat/completions",
        data={"model": MODEL, "messages": [{"role": {}, "content": ""}]},
        content_type="application/json",
        headers=auth,
    )
    assert response.status_code == 400
    assert json.loads(response.content)["error"]["param"] == "messages[0].role"
