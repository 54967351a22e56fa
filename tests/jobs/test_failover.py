"""DESIGN.md "When a host fails", before the first token: deadlines, failover, 502.

Scripted hosts (tests.hostsim) fail on purpose; deadlines are shortened through
the settings (``fast_deadlines``) and tests wait on frames, never on sleeps.
"""

from __future__ import annotations

import json

import pytest

from billing.models import Earning, LedgerTransaction
from billing.services import renter_balance_nano
from hosts.models import DeviceOutcome
from jobs.models import Attempt, Job

from .helpers import (
    chat_request,
    host_online,
    read_body,
    sse_events,
    sse_text,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def _finish_reason(events: list) -> str | None:
    """The ``finish_reason`` a streamed answer ended with."""
    reasons = [
        chunk["choices"][0]["finish_reason"]
        for chunk in events
        if chunk != "[DONE]" and chunk.get("choices")
    ]
    return reasons[-1] if reasons else None


async def _attempts(job_id):
    return [
        a
        async for a in Attempt.objects.filter(job_id=job_id)
        .order_by("offered_at")
        .select_related("device__machine")
    ]


async def _fails_then_good_host(machine_token, api_key, misbehave):
    """Host ``bad`` (ranked first) misbehaves; host ``good`` answers. Returns job + text."""
    bad = await host_online(machine_token, "bad", score=90)
    good = await host_online(machine_token, "good", score=60)
    request = chat_request(api_key)
    offer = await bad.recv_type("offer")
    await misbehave(bad, offer)
    second = await good.recv_type("offer")
    assert second["job"] != offer["job"]
    assert second["continue_from"] == ""
    await good.answer(second, ["Hello", " there"])
    response = await request
    assert response.status_code == 200
    text = sse_text(sse_events(await read_body(response)))
    job_id = response["x-ballast-job-id"]
    cancel = await bad.recv_type("cancel")
    assert cancel["job"] == offer["job"], "the failed host is told to stop"
    await bad.close()
    await good.close()
    return job_id, text


async def _never_claims(host, offer):
    pass


async def _claims_then_silent(host, offer):
    await host.claim(offer["job"])


async def _sends_error(host, offer):
    await host.claim(offer["job"])
    await host.send(
        {"type": "error", "job": offer["job"], "message": "CUDA out of memory"}
    )


async def _empty_done(host, offer):
    await host.claim(offer["job"])
    await host.done(offer["job"], 0)


async def _refuses_offer(host, offer):
    await host.send({"type": "error", "job": offer["job"], "message": "no free slot"})


async def _error_with_nul(host, offer):
    """An error whose message PostgreSQL text cannot hold (a NUL) and that is not
    UTF-8 (a lone surrogate): still the host's error, never the coordinator's."""
    await host.claim(offer["job"])
    await host.send({"type": "error", "job": offer["job"], "message": "bad\x00\ud800"})


async def _error_not_text(host, offer):
    await host.claim(offer["job"])
    await host.send({"type": "error", "job": offer["job"], "message": {"no": 1}})


async def _malformed_token(host, offer):
    await host.claim(offer["job"])
    await host.send({"type": "token", "job": offer["job"], "text": 7})


async def _malformed_done(host, offer):
    await host.claim(offer["job"])
    await host.send({"type": "done", "job": offer["job"], "usage": "lots"})


@pytest.mark.parametrize(
    "misbehave, outcome",
    [
        (_never_claims, "claim_timeout"),
        (_claims_then_silent, "first_token_timeout"),
        (_sends_error, "host_error"),
        (_refuses_offer, "host_error"),
        (_error_with_nul, "host_error"),
        (_error_not_text, "host_error"),
        (_malformed_token, "host_error"),
        (_malformed_done, "host_error"),
    ],
    ids=[
        "never claims",
        "claims then silent",
        "error frame",
        "refuses",
        "error with NUL and a lone surrogate",
        "error message not text",
        "malformed token",
        "malformed done",
    ],
)
async def test_it_fails_over_before_the_first_token(
    catalog, api_key, machine_token, fast_deadlines, misbehave, outcome
):
    job_id, text = await _fails_then_good_host(machine_token, api_key, misbehave)
    assert text == "Hello there", "the renter sees one reply"
    attempts = await _attempts(job_id)
    assert [a.outcome for a in attempts] == [outcome, "succeeded"]
    assert (
        attempts[0].device.machine.name == "bad"
        and attempts[1].device.machine.name == "good"
    )
    job = await Job.objects.aget(id=job_id)
    assert job.status == Job.Status.SUCCEEDED and job.failed_over is False
    bad_device = attempts[0].device
    await bad_device.arefresh_from_db()
    assert bad_device.slots_used == 0, "the failed attempt's slot is freed"
    assert bad_device.score < 60, "the failure lowers the device's standing"
    assert await DeviceOutcome.objects.filter(
        device=bad_device, success=False, reason=outcome
    ).aexists()
    assert not await Earning.objects.filter(attempt=attempts[0]).aexists()


@pytest.mark.parametrize("finish_reason", ["length", "stop"])
async def test_an_empty_done_the_request_explains_is_the_answer(
    catalog, api_key, machine_token, fast_deadlines, finish_reason
):
    """A ``max_tokens`` too small for one character makes an honest model
    answer nothing (``empty_answer_explained``): that is the answer (200,
    empty, nothing billed), not the device's failure, and no other device is
    asked. Its finish reason is ``length`` when the host says ``max_tokens``
    cut that character, ``stop`` when the model ended at once."""
    bad = await host_online(machine_token, "bad", score=90)
    good = await host_online(machine_token, "good", score=60)
    request = chat_request(api_key, max_tokens=2)
    offer = await bad.recv_type("offer")
    await bad.claim(offer["job"])
    await bad.done(offer["job"], 2 if finish_reason == "length" else 0, finish_reason=finish_reason)
    response = await request
    assert response.status_code == 200
    events = sse_events(await read_body(response))
    assert sse_text(events) == ""
    reasons = [
        choice["finish_reason"]
        for event in events
        if isinstance(event, dict)
        for choice in event.get("choices", [])
        if choice.get("finish_reason")
    ]
    assert reasons == [finish_reason]
    assert await good.ws.receive_nothing(), "no second device is asked"
    attempts = await _attempts(response["x-ballast-job-id"])
    assert [a.outcome for a in attempts] == ["empty_answer"]
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert job.status == Job.Status.SUCCEEDED and job.cost_nano == 0
    bad_device = attempts[0].device
    await bad_device.arefresh_from_db()
    assert bad_device.slots_used == 0
    assert bad_device.score == 90, "the score the test gave it, untouched"
    assert not await DeviceOutcome.objects.filter(device=bad_device).aexists()
    await bad.close()
    await good.close()


async def test_an_empty_done_beside_a_stop_asks_a_second_device(
    catalog, api_key, machine_token, fast_deadlines
):
    """A ``stop`` the host says matched at once is its word alone (fresh-eyes
    review 3: any stop made a cheat's empty ``done`` the renter's answer):
    another device is asked, and its answer is the renter's; when it too
    answers nothing, that is the answer. Nobody is blamed either way."""
    bad = await host_online(machine_token, "bad", score=90)
    good = await host_online(machine_token, "good", score=60)
    request = chat_request(api_key, stop=["\n"])
    await _empty_done(bad, await bad.recv_type("offer"))
    await good.answer(await good.recv_type("offer"), ["Hello", " there"])
    response = await request
    assert sse_text(sse_events(await read_body(response))) == "Hello there"
    attempts = await _attempts(response["x-ballast-job-id"])
    assert [a.outcome for a in attempts] == ["empty_answer", "succeeded"]
    assert not await DeviceOutcome.objects.filter(device=attempts[0].device).aexists()
    request = chat_request(api_key, stop=["\n"])  # (bad is offered first: its score)
    await _empty_done(bad, await bad.recv_type("offer"))
    await _empty_done(good, await good.recv_type("offer"))
    response = await request
    assert response.status_code == 200
    assert sse_text(sse_events(await read_body(response))) == ""
    attempts = await _attempts(response["x-ballast-job-id"])
    assert [a.outcome for a in attempts] == ["empty_answer", "empty_answer"]
    for attempt in attempts:
        failures = DeviceOutcome.objects.filter(device=attempt.device, success=False)
        assert not await failures.aexists()
    await bad.close()
    await good.close()


@pytest.mark.parametrize("temperature, blamed", [(0, True), (0.7, False)])
async def test_an_empty_done_another_device_contradicts_at_temperature_0_is_a_failure(
    catalog, api_key, machine_token, fast_deadlines, temperature, blamed
):
    """At temperature 0 every device draws the same first token: an empty
    answer where another device answered with text was its host's refusal
    (fresh-eyes review 4: refusing by an empty done cost nothing). A failure
    on its score, not a failed check; sampled, nobody is blamed."""
    bad = await host_online(machine_token, "bad", score=90)
    good = await host_online(machine_token, "good", score=60)
    request = chat_request(api_key, temperature=temperature)
    await _empty_done(bad, await bad.recv_type("offer"))
    await good.answer(await good.recv_type("offer"), ["Hello", " there"])
    response = await request
    assert sse_text(sse_events(await read_body(response))) == "Hello there"
    attempts = await _attempts(response["x-ballast-job-id"])
    failures = DeviceOutcome.objects.filter(
        device=attempts[0].device, success=False, reason="empty_answer_contradicted"
    )
    assert await failures.aexists() is blamed
    assert not await DeviceOutcome.objects.filter(
        device=attempts[0].device, source="spot_check"
    ).aexists(), "no failed check"
    await bad.close()
    await good.close()


async def test_an_unexplained_empty_done_asks_a_second_device_and_blames_nobody(
    catalog, api_key, machine_token, fast_deadlines
):
    """A prompt the model ends at once (a raw prompt ending in its end-of-turn
    text) gives an honest host nothing to send: its empty ``done`` is not a
    failure (DESIGN.md "Fair to honest hosts"). Another device is asked once;
    its answer is the renter's, and the first device's score is untouched."""
    bad = await host_online(machine_token, "bad", score=90)
    good = await host_online(machine_token, "good", score=60)
    request = chat_request(api_key)
    offer = await bad.recv_type("offer")
    await _empty_done(bad, offer)
    second = await good.recv_type("offer")
    await good.answer(second, ["Hello", " there"])
    response = await request
    assert sse_text(sse_events(await read_body(response))) == "Hello there"
    attempts = await _attempts(response["x-ballast-job-id"])
    assert [a.outcome for a in attempts] == ["empty_answer", "succeeded"]
    bad_device = attempts[0].device
    await bad_device.arefresh_from_db()
    assert bad_device.slots_used == 0 and bad_device.score == 90
    assert not await DeviceOutcome.objects.filter(device=bad_device).aexists()
    assert not await Earning.objects.filter(attempt=attempts[0]).aexists()
    await bad.close()
    await good.close()


async def test_two_empty_answers_are_the_answer_and_a_renter_who_keeps_asking_is_limited(
    catalog, api_key, machine_token, fast_deadlines, settings
):
    """Two devices that both answer nothing agree: the renter gets the empty
    answer (200, ``stop``, nothing billed), neither device loses anything.
    Past ``BALLAST_EMPTY_ANSWER_RATE`` empty answers the key is refused (429),
    not the hosts."""
    settings.BALLAST_EMPTY_ANSWER_RATE = "1/hour"
    first = await host_online(machine_token, "first", score=90)
    second = await host_online(machine_token, "second", score=80)
    request = chat_request(api_key)
    await _empty_done(first, await first.recv_type("offer"))
    await _empty_done(second, await second.recv_type("offer"))
    response = await request
    assert response.status_code == 200
    events = sse_events(await read_body(response))
    assert sse_text(events) == ""
    assert _finish_reason(events) == "stop"
    attempts = await _attempts(response["x-ballast-job-id"])
    assert [a.outcome for a in attempts] == ["empty_answer", "empty_answer"]
    for attempt in attempts:
        device = attempt.device
        await device.arefresh_from_db()
        assert device.slots_used == 0
        assert not await DeviceOutcome.objects.filter(device=device).aexists()
    refused = await chat_request(api_key)
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) >= 1
    assert "empty answer" in json.loads(refused.content)["error"]["message"]
    assert (await first.recv())["type"] == "cancel", "its empty attempt's"
    assert await first.ws.receive_nothing(), "no host is offered the refused request"
    await first.close()
    await second.close()


async def test_a_lone_device_that_answers_nothing_gives_the_empty_answer(
    catalog, api_key, machine_token, fast_deadlines
):
    """With no other device to ask, the one empty answer stands: 200, not a
    502 that would read as the host's failure, and at once, not after the
    queue's wall clock (fresh-eyes review 5: 66 s for an empty answer)."""
    fast_deadlines.BALLAST_QUEUE_TIMEOUT_S = 3600  # (a wait would hang the test)
    only = await host_online(machine_token, "only", score=90)
    request = chat_request(api_key)
    await _empty_done(only, await only.recv_type("offer"))
    response = await request
    assert response.status_code == 200
    assert sse_text(sse_events(await read_body(response))) == ""
    await only.close()


async def test_it_answers_502_and_bills_nothing_when_every_attempt_fails(
    catalog, api_key, renter, machine_token, fast_deadlines, settings
):
    settings.BALLAST_MAX_ATTEMPTS = 3
    hosts = [
        await host_online(machine_token, f"bad{i}", score=90 - i) for i in range(3)
    ]
    spare = await host_online(machine_token, "spare", score=10)
    balance = await _balance(renter)
    request = chat_request(api_key)
    seen = set()
    for host in hosts:
        offer = await host.recv_type("offer")
        assert offer["job"] not in seen, "never the same attempt twice"
        seen.add(offer["job"])
        await host.send({"type": "error", "job": offer["job"], "message": "boom"})
    response = await request
    assert response.status_code == 502
    body = json.loads(response.content)
    assert body["error"]["code"] == "all_attempts_failed"
    assert await spare.ws.receive_nothing(timeout=0.3), "no fourth attempt"
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert (
        job.status == Job.Status.FAILED
        and job.cost_nano == 0
        and job.tokens_billed == 0
    )
    assert await _balance(renter) == balance
    assert not await LedgerTransaction.objects.filter(job=job).aexists()
    devices = {a.device_id for a in await _attempts(job.id)}
    assert len(devices) == 3
    for host in [*hosts, spare]:
        await host.close()


async def test_the_only_device_failing_before_output_is_a_502_not_no_capacity(
    catalog, api_key, machine_token, fast_deadlines
):
    """PROTOCOL.md: 502 when every attempt failed before any output; 503 is for
    a request no live device could take at all (found by a fresh-eyes check:
    the one agent killed before its first token gave 503 ``no_capacity``)."""
    host = await host_online(machine_token, "only")
    request = chat_request(api_key, stream=False)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.close()  # gone before its first token; no other device
    response = await request
    body = json.loads(response.content)
    assert (response.status_code, body["error"]["code"]) == (
        502,
        "all_attempts_failed",
    ), body
    assert "1 attempt(s) failed" in body["error"]["message"]
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert job.status == Job.Status.FAILED and job.cost_nano == 0


async def _balance(user):
    from channels.db import database_sync_to_async

    return await database_sync_to_async(renter_balance_nano)(user=user)


async def test_it_ignores_late_frames_of_a_failed_attempt(
    catalog, api_key, machine_token, fast_deadlines
):
    bad = await host_online(machine_token, "bad", score=90)
    good = await host_online(machine_token, "good", score=60)
    request = chat_request(api_key, stream=False)
    offer = await bad.recv_type("offer")
    second = await good.recv_type("offer")  # the bad host missed its claim deadline
    await good.answer(second, ["Fine"])
    response = await request
    assert json.loads(response.content)["choices"][0]["message"]["content"] == "Fine"
    await bad.recv_type("cancel")
    # the slow host wakes up and sends everything late
    await bad.claim(offer["job"])
    await bad.token(offer["job"], "late text")
    await bad.done(offer["job"], 2)
    # it was told to cancel: its late frames are dropped without error frames
    assert await bad.errors_within(0.2) == []
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    attempts = await _attempts(job.id)
    assert attempts[0].outcome == "claim_timeout" and attempts[0].output_chars == 0
    assert job.output_text == "Fine"
    assert await LedgerTransaction.objects.filter(job=job).acount() == 1
    assert await Earning.objects.filter(attempt__job=job).acount() == 1
    await bad.close()
    await good.close()
