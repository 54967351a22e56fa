"""A renter's request relayed through a scripted host over the real ASGI app."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.test import AsyncClient

from jobs.models import Attempt, Job
from jobs.tokens import token_count
from tests.hostsim import MODEL

from .helpers import host_online

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def _host(machine_token, name="rig"):
    """A scripted host whose heartbeat has made its machine live (a state)."""
    return await host_online(machine_token, name)


def _sse_payloads(body: bytes) -> list:
    out = []
    for block in body.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def _body(response) -> bytes:
    chunks = []
    async for chunk in response.streaming_content:
        chunks.append(chunk)
    return b"".join(chunks)


async def test_it_streams_a_chat_answer_and_bills_it(catalog, api_key, machine_token):
    host = await _host(machine_token)
    client = AsyncClient()
    request = asyncio.create_task(
        client.post(
            "/v1/chat/completions",
            data={
                "model": MODEL,
                "messages": [{"role": "user", "content": "What is 2+2?"}],
                "stream": True,
                "stream_options": {"include_usage": True},
                "temperature": 0,
            },
            content_type="application/json",
            headers={"authorization": f"Bearer {api_key}"},
        )
    )
    offer = await host.recv_type("offer")
    assert offer["model"] == MODEL
    assert offer["messages"] == [{"role": "user", "content": "What is 2+2?"}]
    assert offer["continue_from"] == ""
    await host.answer(offer, ["2+2", " is", " 4."])
    response = await request
    assert response.status_code == 200
    job_id = response["x-ballast-job-id"]
    payloads = _sse_payloads(await _body(response))
    assert payloads[-1] == "[DONE]"
    text = "".join(
        p["choices"][0]["delta"].get("content", "")
        for p in payloads[:-1]
        if p["choices"]
    )
    assert text == "2+2 is 4."
    tokens = token_count(MODEL, "2+2 is 4.")
    assert payloads[-2]["usage"]["completion_tokens"] == tokens
    job = await Job.objects.aget(id=job_id)
    assert job.status == Job.Status.SUCCEEDED
    assert job.output_text == "2+2 is 4."
    assert job.tokens_billed == tokens and job.cost_nano == tokens * 200
    attempt = await Attempt.objects.aget(job=job)
    assert attempt.receipt_valid is True
    assert attempt.outcome == Attempt.Outcome.SUCCEEDED
    assert attempt.claimed_at and attempt.first_token_at and attempt.ended_at
    await host.close()


async def test_it_answers_a_raw_completion_without_streaming(
    catalog, api_key, machine_token
):
    host = await _host(machine_token)
    client = AsyncClient()
    request = asyncio.create_task(
        client.post(
            "/v1/completions",
            data={"model": MODEL, "prompt": "Once upon", "max_tokens": 5},
            content_type="application/json",
            headers={"authorization": f"Bearer {api_key}"},
        )
    )
    offer = await host.recv_type("offer")
    assert offer["prompt"] == "Once upon" and "messages" not in offer
    assert offer["params"]["max_tokens"] == 5
    await host.answer(offer, [" a", " time"])
    response = await request
    body = json.loads(response.content)
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == " a time"
    assert body["usage"]["completion_tokens"] == token_count(MODEL, " a time")
    await host.close()
