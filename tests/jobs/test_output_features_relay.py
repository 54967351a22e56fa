"""``response_format`` and ``logprobs`` through the relay (docs/protocol-notes.md
"Output features"): carried by the offer (and a continuation's), the tokens'
log-probabilities checked and relayed to the renter in OpenAI's shapes, over
SSE, a whole response, the completions API and the renter websocket."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.test import AsyncClient

from jobs.models import Attempt, Job
from tests.hostsim import MODEL

from .helpers import chat_request, host_online, read_body, sse_events
from .output_features import ALL, JSON_SCHEMA, response_format_kept


def _entry(text: str, logprob: float = -0.5, alternatives: int = 0) -> dict:
    item = {"token": text, "logprob": logprob, "bytes": list(text.encode())}
    tops = [
        {"token": f"t{i}", "logprob": logprob - i - 1, "bytes": list(f"t{i}".encode())}
        for i in range(alternatives)
    ]
    return {**item, "top_logprobs": tops}


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_offer_carries_the_format_and_the_logprobs_asked(
    catalog, api_key, machine_token
):
    plain = await host_online(machine_token, "plain", score=95)
    able = await host_online(machine_token, "able", score=50, features=ALL)
    request = chat_request(
        api_key, response_format=JSON_SCHEMA, logprobs=True, top_logprobs=2
    )
    offer = await able.recv_type("offer")
    assert offer["response_format"] == response_format_kept(response_format=JSON_SCHEMA)
    assert list(offer["response_format"]["json_schema"]["schema"]["properties"]) == [
        "city",
        "population",
    ], "the properties in the schema's order (the output's)"
    assert offer["logprobs"] == 2
    assert "logprobs" not in offer["params"]
    assert await plain.ws.receive_nothing(timeout=0.1), "the best score cannot serve it"
    job = offer["job"]
    await able.claim(job)
    first = [_entry("{", alternatives=2), _entry('"city": ', alternatives=2)]
    await able.token(job, '{"city": ', logprobs=first)
    rest = '"Paris", "population": 2}'
    await able.token(job, rest, logprobs=[_entry(rest, -1.0, 2)])
    await able.done(job, 3)
    response = await request
    events = [e for e in sse_events(await read_body(response)) if e != "[DONE]"]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert json.loads(text) == {"city": "Paris", "population": 2}
    content = [
        item
        for e in events
        if e["choices"][0]["logprobs"] is not None
        for item in e["choices"][0]["logprobs"]["content"]
    ]
    assert [c["token"] for c in content] == ["{", '"city": ', rest]
    assert content[0]["top_logprobs"] == _entry("{", alternatives=2)["top_logprobs"]
    assert b"".join(bytes(c["bytes"]) for c in content) == text.encode()
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    for host in (plain, able):
        await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_whole_response_carries_every_tokens_logprobs(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "able", features=ALL)
    request = chat_request(api_key, stream=False, logprobs=True)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    for piece in ("Hel", "lo", "!"):
        await host.token(offer["job"], piece, logprobs=[_entry(piece)])
    await host.done(offer["job"], 3)
    body = json.loads((await request).content)
    choice = body["choices"][0]
    assert choice["message"]["content"] == "Hello!"
    assert [c["token"] for c in choice["logprobs"]["content"]] == ["Hel", "lo", "!"]
    assert choice["logprobs"]["refusal"] is None
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_completion_gets_openais_completions_logprobs(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "able", features=ALL)
    prompt = "Say é"
    request = asyncio.create_task(
        AsyncClient().post(
            "/v1/completions",
            data={"model": MODEL, "prompt": prompt, "logprobs": 1},
            content_type="application/json",
            headers={"authorization": f"Bearer {api_key}"},
        )
    )
    offer = await host.recv_type("offer")
    assert offer["logprobs"] == 1
    await host.claim(offer["job"])
    await host.token(offer["job"], " é", logprobs=[_entry(" é", -0.1, 1)])
    await host.token(offer["job"], "té", logprobs=[_entry("té", -0.2, 1)])
    await host.done(offer["job"], 2)
    logprobs = json.loads((await request).content)["choices"][0]["logprobs"]
    assert logprobs == {
        "tokens": [" é", "té"],
        "token_logprobs": [-0.1, -0.2],
        "top_logprobs": [{"t0": -1.1}, {"t0": -1.2}],
        "text_offset": [len(prompt), len(prompt) + 2],  # characters, not bytes
    }
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    "extra",
    [
        {},  # asked for, not sent: never a silent drop
        {"logprobs": [_entry("a-much-longer-token")]},  # more bytes than the text
        {"logprobs": [{**_entry("Hi"), "logprob": 0.5}]},
        {"logprobs": [_entry("Hi", alternatives=3)]},  # more alternatives than asked
    ],
    ids=["missing", "bytes past the text", "positive", "too many alternatives"],
)
async def test_a_token_frame_without_the_logprobs_asked_fails_the_attempt(
    catalog, api_key, machine_token, fast_deadlines, extra
):
    host = await host_online(machine_token, "sloppy", features=ALL)
    request = chat_request(api_key, stream=False, logprobs=True, top_logprobs=2)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], "Hi", **extra)
    assert (await host.recv_type("error"))["message"].startswith("token:")
    response = await request
    assert response.status_code == 502, "its only device failed it"
    attempt = await Attempt.objects.aget(id=offer["job"])
    assert attempt.outcome == Attempt.Outcome.HOST_ERROR
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_continuation_goes_on_under_the_same_format(
    catalog, api_key, machine_token, fast_deadlines
):
    first = await host_online(machine_token, "first", score=90, features=ALL)
    second = await host_online(machine_token, "second", score=60, features=ALL)
    plain = await host_online(machine_token, "plain", score=95)
    request = chat_request(api_key, response_format=JSON_SCHEMA, logprobs=True)
    offer = await first.recv_type("offer")
    await first.claim(offer["job"])
    await first.token(offer["job"], '{"city": "Pa', logprobs=[_entry('{"city": "Pa')])
    response = await request
    body = asyncio.create_task(read_body(response))
    await first.close()
    resume = await second.recv_type("offer")
    assert resume["continue_from"] == '{"city": "Pa'
    assert resume["response_format"] == offer["response_format"]
    assert resume["logprobs"] == 0
    await second.claim(resume["job"])
    rest = 'ris", "population": 3}'
    await second.token(resume["job"], rest, logprobs=[_entry(rest)])
    await second.done(resume["job"], 4)
    events = [e for e in sse_events(await body) if e != "[DONE]"]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert json.loads(text) == {"city": "Paris", "population": 3}
    tokens = [
        c["token"]
        for e in events
        if e["choices"][0]["logprobs"]
        for c in e["choices"][0]["logprobs"]["content"]
    ]
    assert tokens == ['{"city": "Pa', rest]
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert job.failed_over and job.status == Job.Status.SUCCEEDED
    assert await plain.ws.receive_nothing(timeout=0.1)
    for host in (second, plain):
        await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_renter_websocket_gets_the_same_logprobs_and_format(
    catalog, api_key, machine_token
):
    from channels.testing import WebsocketCommunicator

    from ballast.asgi import application

    host = await host_online(machine_token, "able", features=ALL)
    ws = WebsocketCommunicator(
        application,
        "/ws/v1/chat/",
        headers=[(b"authorization", f"Bearer {api_key}".encode())],
    )
    assert (await ws.connect())[0]
    await ws.send_json_to(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "JSON please"}],
            "response_format": {"type": "json_object"},
            "logprobs": True,
            "top_logprobs": 1,
        }
    )
    offer = await host.recv_type("offer")
    assert offer["response_format"] == {"type": "json_object"}
    await host.claim(offer["job"])
    await host.token(offer["job"], "{}", logprobs=[_entry("{}", alternatives=1)])
    await host.done(offer["job"], 1)
    chunk = await ws.receive_json_from(timeout=5)
    assert chunk["choices"][0]["delta"]["content"] == "{}"
    assert chunk["choices"][0]["logprobs"]["content"] == [_entry("{}", alternatives=1)]
    while (await ws.receive_json_from(timeout=5)).get("type") != "done":
        pass
    await ws.disconnect()
    await host.close()
