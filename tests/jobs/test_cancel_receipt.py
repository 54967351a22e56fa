"""Hosts are paid for what the renter received when the coordinator ends their
segment (issue 23 item 3; DESIGN.md "Money"): the renter goes away, or the
answer is cut at ``max_tokens``. The host answers the ``cancel`` with
``cancelled`` (usage and a receipt over the text it sent) and is paid 80 % of
what the renter was billed for that segment, once; a host that sends nothing,
or a receipt that does not verify, is paid nothing."""

from __future__ import annotations

import pytest
from django.conf import settings

from billing.models import Earning
from billing.money import share_of
from jobs.models import Attempt, Job

from .helpers import chat_request, host_online, job_closed, renter_ws

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def _renter_leaves_mid_stream(api_key, host, pieces=("One,", " two,")):
    """A renter websocket receives ``pieces`` of the host's answer and goes away;
    returns the attempt id after the host got its ``cancel``."""
    ws = await renter_ws(api_key, "Count")
    offer = await host.recv_type("offer")
    job = offer["job"]
    await host.claim(job)
    for piece in pieces:
        await host.token(job, piece)
        chunk = await ws.receive_json_from(timeout=5)
        assert chunk["choices"][0]["delta"]["content"] == piece
    await ws.disconnect()
    cancel = await host.recv_type("cancel")
    assert cancel["job"] == job
    return job


async def _host_share(job: Job) -> int:
    return share_of(job.cost_nano, settings.BALLAST_HOST_SHARE)


async def test_a_renter_gone_mid_stream_pays_the_host_against_its_receipt(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "rig")
    attempt_id = await _renter_leaves_mid_stream(api_key, host)
    await host.token(attempt_id, " three")  # crossed the cancel: sent, not delivered
    await host.cancelled(attempt_id)  # signs all three pieces
    attempt = await Attempt.objects.select_related("job").aget(id=attempt_id)
    job = await job_closed(attempt.job_id)
    assert job.status == Job.Status.CANCELLED and job.output_text == "One, two,"
    assert job.cost_nano > 0
    earnings = [e async for e in Earning.objects.filter(attempt_id=attempt_id)]
    assert [e.amount_nano for e in earnings] == [await _host_share(job)]
    # a second answer (or a done that crossed) pays nothing more
    await host.cancelled(attempt_id)
    await host.done(attempt_id, 3)
    assert await host.ws.receive_nothing(timeout=0.2)
    assert await Earning.objects.filter(attempt_id=attempt_id).acount() == 1


async def test_a_host_that_sends_no_receipt_is_paid_nothing(
    catalog, api_key, machine_token, settings
):
    settings.BALLAST_CANCEL_RECEIPT_WAIT_S = 0.3
    host = await host_online(machine_token, "rig")
    attempt_id = await _renter_leaves_mid_stream(api_key, host)
    attempt = await Attempt.objects.aget(id=attempt_id)
    job = await job_closed(attempt.job_id)
    assert job.cost_nano > 0  # the renter pays for what it received
    assert not await Earning.objects.filter(attempt_id=attempt_id).aexists()
    await host.close()


async def test_a_host_that_died_is_paid_nothing(catalog, api_key, machine_token):
    host = await host_online(machine_token, "rig")
    attempt_id = await _renter_leaves_mid_stream(api_key, host)
    await host.close()
    attempt = await Attempt.objects.aget(id=attempt_id)
    job = await job_closed(attempt.job_id)
    assert job.cost_nano > 0
    assert not await Earning.objects.filter(attempt_id=attempt_id).aexists()


@pytest.mark.parametrize("lie", ["other_text", "forged"])
async def test_a_receipt_that_does_not_verify_is_paid_nothing(
    catalog, api_key, machine_token, lie
):
    host = await host_online(machine_token, "rig")
    attempt_id = await _renter_leaves_mid_stream(api_key, host)
    if lie == "other_text":
        host.sent_text[attempt_id] = "One, two, and more than was sent"
        await host.cancelled(attempt_id)
    else:
        await host.cancelled(attempt_id, receipt="A" * 86 + "==")
    attempt = await Attempt.objects.aget(id=attempt_id)
    job = await job_closed(attempt.job_id)
    assert job.cost_nano > 0
    assert not await Earning.objects.filter(attempt_id=attempt_id).aexists()
    await host.close()


async def test_an_answer_cut_at_max_tokens_pays_the_host_for_what_was_delivered(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "rig")
    answer = chat_request(api_key, stream=False, max_tokens=3)
    offer = await host.recv_type("offer")
    job_id = offer["job"]
    await host.claim(job_id)
    for piece in [" one", " two", " three", " four", " five", " six"]:
        await host.token(job_id, piece)
    await host.recv_type("cancel")
    await host.cancelled(job_id)
    response = await answer
    assert response.json()["choices"][0]["finish_reason"] == "length"
    # the prompt is counted by the model's tokenizer (the cut and the
    # cancelled frame report no prompt count): never 0
    assert response.json()["usage"]["prompt_tokens"] > 0
    attempt = await Attempt.objects.select_related("job").aget(id=job_id)
    job = await job_closed(attempt.job_id)
    assert job.status == Job.Status.SUCCEEDED and job.tokens_billed == 3
    assert job.prompt_tokens == response.json()["usage"]["prompt_tokens"]
    earnings = [e.amount_nano async for e in Earning.objects.filter(attempt=attempt)]
    assert earnings == [await _host_share(job)] and earnings[0] > 0
    await host.close()


async def test_a_cancelled_for_a_job_not_cancelled_here_is_an_error(
    catalog, machine_token
):
    host = await host_online(machine_token, "rig")
    await host.cancelled("not-a-job-of-this-machine", 1)
    error = await host.recv_type("error")
    assert "not cancelled on this machine" in error["message"]
    await host.close()
