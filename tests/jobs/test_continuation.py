"""DESIGN.md "When a host fails", after output: the one continuation.

The renter's stream goes on in the same response from exactly the text received;
nothing is repeated or dropped; the dead host is not paid for its segment.
"""

from __future__ import annotations

import asyncio

import pytest

from billing.models import Earning
from jobs.models import Attempt, Job
from jobs.tokens import token_count
from tests.hostsim import MODEL

from .helpers import chat_request, host_online, read_body, sse_events, sse_text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def _attempts(job_id):
    return [
        a async for a in Attempt.objects.filter(job_id=job_id).order_by("offered_at")
    ]


async def _close(host, offer):
    await host.close()


async def _error(host, offer):
    await host.send(
        {"type": "error", "job": offer["job"], "message": "GPU fell off the bus"}
    )


async def _stall(host, offer):
    pass  # keeps the connection, sends nothing more: the stall window ends it


async def streaming_then_dead(host, api_key: str, text: str, **extra):
    """Start a streamed request that ``host`` claims and answers with ``text``;
    once the renter has the response, the host's connection drops. Returns
    (the offer, the response, the task reading the body to its end)."""
    request = chat_request(api_key, **extra)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], text)
    response = await request
    body = asyncio.create_task(read_body(response))  # the renter keeps reading
    await host.close()
    return offer, response, body


@pytest.mark.parametrize(
    "die, outcome",
    [(_close, "died_midstream"), (_error, "died_midstream"), (_stall, "stalled")],
    ids=["connection closed", "error frame", "stalled"],
)
@pytest.mark.parametrize(
    "before, after",
    [
        (["The capital", " of Fr"], ["ance is Paris."]),  # mid-word
        (["Emoji: 👩\u200d"], ["💻 done"]),  # mid grapheme (zero-width joiner sequence)
    ],
    ids=["mid-word", "mid-character-sequence"],
)
async def test_it_continues_from_exactly_what_the_renter_received(
    catalog, api_key, machine_token, fast_deadlines, die, outcome, before, after
):
    first = await host_online(machine_token, "first", score=90)
    second = await host_online(machine_token, "second", score=60)
    request = chat_request(api_key, stream_options={"include_usage": True})
    offer = await first.recv_type("offer")
    await first.claim(offer["job"])
    for piece in before:
        await first.token(offer["job"], piece)
    response = await request
    assert response.status_code == 200
    body = asyncio.create_task(read_body(response))  # the renter keeps reading
    await die(first, offer)
    resume = await second.recv_type("offer")
    received = "".join(before)
    assert resume["continue_from"] == received
    assert resume["messages"] == offer["messages"], "the original conversation"
    spent = token_count(MODEL, received)
    assert resume["params"] == {
        **offer["params"],
        "max_tokens": offer["params"]["max_tokens"] - spent,
    }
    await second.answer(resume, after)
    events = sse_events(await body)
    assert events[-1] == "[DONE]"
    assert sse_text(events) == received + "".join(after)
    finish = [
        e
        for e in events
        if e != "[DONE]" and e["choices"] and e["choices"][0]["finish_reason"]
    ]
    assert finish[-1]["choices"][0]["finish_reason"] == "stop"

    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert job.status == Job.Status.SUCCEEDED and job.failed_over is True
    dead, resumed = await _attempts(job.id)
    assert (dead.outcome, dead.kind) == (outcome, "fresh")
    assert (resumed.outcome, resumed.kind) == ("succeeded", "continuation")
    assert resumed.continue_from_chars == len(received)
    assert dead.output_text == received and resumed.output_text == "".join(after)
    # money: the dead segment is billed to the renter (received) but earns nothing;
    # the continuation bills only its new tokens
    assert dead.tokens_billed == token_count(MODEL, received)
    assert resumed.tokens_billed == token_count(MODEL, "".join(after))
    assert job.tokens_billed == dead.tokens_billed + resumed.tokens_billed
    assert job.cost_nano == job.tokens_billed * catalog.price_completion_nano
    assert not await Earning.objects.filter(attempt=dead).aexists()
    assert await Earning.objects.filter(attempt=resumed).aexists()
    usage = [e for e in events if e != "[DONE]" and e.get("usage")][-1]["usage"]
    assert usage["completion_tokens"] == job.tokens_billed
    # the continuation's reported prompt (10 here) holds the text it continued:
    # the renter's own prompt is counted (found by a fresh-eyes check)
    from jobs.tokens import prompt_token_count

    assert usage["prompt_tokens"] == job.prompt_tokens
    assert job.prompt_tokens == prompt_token_count(MODEL, job.messages, None) != 10
    await first.close()
    await second.close()


async def test_it_ends_the_stream_with_an_error_when_the_continuation_dies_too(
    catalog, api_key, machine_token, fast_deadlines
):
    first = await host_online(machine_token, "first", score=90)
    second = await host_online(machine_token, "second", score=80)
    third = await host_online(machine_token, "third", score=70)
    _, response, body = await streaming_then_dead(first, api_key, "One, two")
    resume = await second.recv_type("offer")
    assert resume["continue_from"] == "One, two"
    await second.claim(resume["job"])
    await second.token(resume["job"], ", three")
    await second.close()
    events = sse_events(await body)
    assert sse_text(events) == "One, two, three"
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["choices"][0]["finish_reason"] == "error"
    assert last["error"]["code"] == "continuation_failed"
    assert await third.ws.receive_nothing(timeout=0.3), (
        "at most one continuation per request"
    )
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert job.status == Job.Status.FAILED and job.failed_over
    assert job.output_text == "One, two, three"
    assert job.tokens_billed == token_count(MODEL, "One, two") + token_count(
        MODEL, ", three"
    )
    assert not await Earning.objects.filter(attempt__job=job).aexists()
    await third.close()


async def test_it_ends_the_stream_with_an_error_when_no_device_takes_the_continuation(
    catalog, api_key, machine_token, fast_deadlines
):
    first = await host_online(machine_token, "first", score=90)
    second = await host_online(machine_token, "second", score=80)
    _, response, body = await streaming_then_dead(first, api_key, "Partial")
    await second.recv_type("offer")  # never claims
    events = sse_events(await body)
    assert sse_text(events) == "Partial"
    assert events[-2]["choices"][0]["finish_reason"] == "error"
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert [a.outcome for a in await _attempts(job.id)] == [
        "died_midstream",
        "claim_timeout",
    ]
    await second.close()


async def test_a_host_dying_mid_answer_with_no_other_device_says_so(
    catalog, api_key, machine_token, fast_deadlines
):
    """The only device's host died after output: the stream ends with an error
    naming the stopped answer, not "no capacity" as if nothing had started."""
    only = await host_online(machine_token, "only")
    _, _, body = await streaming_then_dead(only, api_key, "One, two")
    events = sse_events(await body)
    assert sse_text(events) == "One, two" and events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["code"] == "continuation_failed"
    assert "stopped mid-answer" in error["message"]


async def test_a_non_streamed_answer_cut_short_reports_its_prompt_tokens(
    catalog, api_key, machine_token, fast_deadlines
):
    """The only host died after output, before any ``done`` (where a prompt's
    count comes from): the 200 with the text received and an error still
    reports the prompt's tokens, counted as the engine counts them."""
    import json

    from jobs.tokens import prompt_token_count

    only = await host_online(machine_token, "only")
    request = chat_request(api_key, stream=False)
    offer = await only.recv_type("offer")
    await only.claim(offer["job"])
    await only.token(offer["job"], "One, two")
    await only.close()
    response = await request
    body = json.loads(response.content)
    assert (
        response.status_code == 200 and body["error"]["code"] == "continuation_failed"
    )
    assert body["choices"][0]["message"]["content"] == "One, two"
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    expected = prompt_token_count(MODEL, job.messages, None)
    assert expected and body["usage"]["prompt_tokens"] == expected
    assert body["usage"]["completion_tokens"] == job.tokens_billed > 0
