"""Verification's edges (issue 22, the fresh-eyes review): what a renter's
request shape must never turn into a failure of an honest host, scores no model
gives, a frame the coordinator cannot read, and how a round ends when the next
one has spoken.

Scripted hosts answer hand-built scores (as in tests/trust/test_verification.py);
the judge is ``trust.verification.plausibility``'s.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from billing.models import Earning
from hosts.models import Device, DeviceOutcome
from jobs.models import Job, Verification
from jobs.tokens import token_count
from tests.hostsim import MODEL
from tests.jobs.helpers import chat_request
from trust.verification.records import verifications_expire

from .verifying import (  # noqa: F401 (verifying: a fixture)
    ANSWER,
    IMPLAUSIBLE,
    PLAUSIBLE,
    host_online,
    ledger_balances,
    scores_of,
    served,
    verification_until,
    verified_and_verifier,
    verify_to,
    verifying,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.mark.parametrize(
    "params, finish_reason",
    [
        ({"temperature": 1.5}, "stop"),  # hotter than text is verified at
        ({"temperature": 2.0}, "length"),
    ],
)
async def test_answers_the_judge_cannot_score_faithfully_are_not_verified(
    verifying, api_key, params, finish_reason
):
    """Above temperature 1 an answer whose host sent no ids is not verified
    (its text tokenized again strays from the support too often); with ids
    it is (tests/trust/test_verification_rate.py), and from 0 to 1 always.
    Such a job goes only to an engine declaring ``token_ids``, so one that
    then sends none is a failed check, billed nothing (fresh-eyes review 5:
    junk above 1 without ids was never checked)."""
    verified = await host_online(
        "a@example.com", "a", verifies=False, score=95, features=("token_ids",)
    )
    verifier = await host_online("b@example.com", "b", verifies=True, score=60)
    offer = await served(api_key, verified, finish_reason=finish_reason, **params)
    job = await Job.objects.aget(attempts__id=offer["job"])
    assert job.status == "succeeded" and job.tokens_billed == 0
    failed = await DeviceOutcome.objects.aget(
        device__machine=verified.machine, source="spot_check"
    )
    assert "without its token ids" in failed.detail
    assert await verifier.ws.receive_nothing(timeout=0.3), "no verify sent"
    assert not await Verification.objects.aexists()
    await verified.close()
    await verifier.close()


async def test_a_job_above_temperature_1_waits_for_an_engine_that_sends_ids(
    verifying, api_key
):
    """No live engine declares ``token_ids``: a 503 naming why."""
    verified, verifier = await verified_and_verifier()
    response = await chat_request(api_key, stream=False, temperature=1.5)
    assert response.status_code == 503
    assert "temperature above 1" in response.json()["error"]["message"]
    await verified.close()
    await verifier.close()


async def test_an_answer_that_reached_max_tokens_under_a_stop_list_is_verified(
    verifying, api_key
):
    """A ``stop`` list the answer never met (``finish_reason`` length) cut
    nothing: the answer is verified like any other, its ``verify`` without
    the list (as every ``verify``: a check must not differ)."""
    verified, verifier = await verified_and_verifier()
    await served(api_key, verified, finish_reason="length", stop=["zzz"], temperature=1.0)
    _, verify = await verify_to([verifier])
    assert verify["params"]["stop"] is None
    await verifier.send(verifier.scores_frame(verify, scores_of(verify, PLAUSIBLE)))
    ver = await verification_until(verify["job"])
    assert ver.verdict == "plausible"
    await verified.close()
    await verifier.close()


async def test_the_verifier_is_paid_for_no_more_tokens_than_the_host_billed(
    verifying, api_key
):
    verified, verifier = await verified_and_verifier()
    recount = token_count(MODEL, "".join(ANSWER))
    offer = await served(api_key, verified, tokens=recount - 2)  # under-reported
    job = await Job.objects.aget(attempts__id=offer["job"])
    assert job.tokens_billed == recount - 2
    _, verify = await verify_to([verifier])
    tokens = scores_of(verify, PLAUSIBLE)  # the recount's
    await verifier.send(verifier.scores_frame(verify, tokens))
    ver = await verification_until(verify["job"])
    assert ver.status == "scored" and ver.n == recount
    host_paid = await Earning.objects.aget(attempt_id=offer["job"])
    assert ver.paid_nano == host_paid.amount_nano, "paid as the host was, no more"
    await ledger_balances()
    await verified.close()
    await verifier.close()


@pytest.mark.parametrize(
    "entry",
    [
        {"rank": 0, "logprob": -1e300, "mean": -1e300, "var": 1e300},  # z NaN
        {"rank": 0, "logprob": -2e6, "mean": -1.0, "var": 1.0},
        {"rank": 0, "logprob": -1.0, "mean": -1.0, "var": 1e13},
    ],
)
async def test_scores_no_model_gives_are_refused_against_the_verifier(
    verifying, api_key, entry
):
    verified, verifier = await verified_and_verifier()
    await served(api_key, verified)
    _, verify = await verify_to([verifier])
    await verifier.send(verifier.scores_frame(verify, scores_of(verify, entry)))
    assert "tokens[0]" in (await verifier.recv_type("error"))["message"]
    ver = await verification_until(verify["job"])
    assert (ver.status, ver.plausible, ver.verdict) == ("refused", None, "")
    against = await DeviceOutcome.objects.aget(device__machine=verifier.machine)
    assert against.success is False
    assert not await Earning.objects.filter(device__machine=verifier.machine).aexists()
    await verified.close()
    await verifier.close()


@pytest.mark.parametrize(
    "frame", ["x" * (256 * 1024 + 1), "{not json"], ids=["past 256 KiB", "not JSON"]
)
async def test_an_unreadable_frame_while_scoring_refuses_the_verification(
    verifying, api_key, frame
):
    verified, verifier = await verified_and_verifier()
    await served(api_key, verified)
    _, verify = await verify_to([verifier])
    await verifier.ws.send_to(text_data=frame)
    assert (await verifier.recv_type("error"))["message"]
    ver = await verification_until(verify["job"])
    assert ver.status == "refused" and "unreadable" in ver.detail
    # its scores afterwards are answered as not open, and change nothing
    await verifier.send(verifier.scores_frame(verify, scores_of(verify, PLAUSIBLE)))
    assert "is not open here" in (
        await verifier.recv_type("error")
    )["message"]
    assert not await Earning.objects.filter(device__machine=verifier.machine).aexists()
    await verified.close()
    await verifier.close()


async def test_late_scores_are_answered_with_an_error_and_change_nothing(
    verifying, api_key
):
    verified, verifier = await verified_and_verifier()
    await served(api_key, verified)
    _, verify = await verify_to([verifier])
    await verification_until(verify["job"], until=lambda v: v.sent_at is not None)
    later = timezone.now() + timedelta(seconds=settings.BALLAST_VERIFY_DEADLINE_S + 1)
    assert await database_sync_to_async(verifications_expire)(now=later) == 1
    await verifier.send(verifier.scores_frame(verify, scores_of(verify, PLAUSIBLE)))
    message = (await verifier.recv_type("error"))["message"]
    assert "past its deadline" in message, message
    ver = await Verification.objects.aget(id=verify["job"])
    assert ver.status == "expired" and ver.paid_nano == 0
    await verified.close()
    await verifier.close()


async def test_a_verify_lost_to_a_restart_expires_against_nobody(verifying, api_key):
    """A verifier whose agent stopped (a graceful Ctrl-C) after its ``verify``
    was sent never answers it: at the deadline that is no failure of its
    (fresh-eyes review 3: a restart cost the honest verifier a failure)."""
    verified, verifier = await verified_and_verifier()
    await served(api_key, verified)
    _, verify = await verify_to([verifier])
    await verification_until(verify["job"], until=lambda v: v.sent_at is not None)
    await verifier.close()
    device = await Device.objects.aget(machine__owner__email="b@example.com")
    later = timezone.now() + timedelta(seconds=settings.BALLAST_VERIFY_DEADLINE_S + 1)
    assert await database_sync_to_async(verifications_expire)(now=later) == 1
    ver = await Verification.objects.aget(id=verify["job"])
    assert ver.status == "expired" and "connection closed" in ver.detail
    assert not await DeviceOutcome.objects.filter(device=device, success=False).aexists()
    await verified.close()


@pytest.mark.parametrize("job", ["not-a-uuid", "0" * 31, 7])
async def test_scores_naming_no_verification_get_an_error_frame(verifying, api_key, job):
    """A ``scores`` whose ``job`` is not a verify frame's (fresh-eyes review
    3: a non-UUID raised in the database lookup, no error frame): an error
    frame naming the field; the open verification stays open."""
    verified, verifier = await verified_and_verifier()
    await served(api_key, verified)
    _, verify = await verify_to([verifier])
    frame = verifier.scores_frame(verify, scores_of(verify, PLAUSIBLE))
    await verifier.send({**frame, "job": job})
    message = (await verifier.recv_type("error"))["message"]
    assert "job" in message, message
    assert (await Verification.objects.aget(id=verify["job"])).status == "offered"
    await verifier.send(frame)
    assert (await verification_until(verify["job"])).verdict == "plausible"
    await verified.close()
    await verifier.close()


@pytest.mark.parametrize("second", ["plausible", "implausible"])
async def test_every_round_takes_the_answers_verdict(verifying, api_key, second):
    """Two implausible verdicts fail the host; one each way with no third
    verifier to ask leaves every round ``unconfirmed``."""
    verified = await host_online("a@example.com", "a", verifies=False, score=95)
    one = await host_online("b@example.com", "b", verifies=True, score=60)
    two = await host_online("c@example.com", "c", verifies=True, score=60)
    await served(api_key, verified)
    host1, verify1 = await verify_to([one, two])
    await host1.send(host1.scores_frame(verify1, scores_of(verify1, IMPLAUSIBLE)))
    host2, verify2 = await verify_to([two if host1 is one else one])
    entry = PLAUSIBLE if second == "plausible" else IMPLAUSIBLE
    await host2.send(host2.scores_frame(verify2, scores_of(verify2, entry)))
    round2 = await verification_until(verify2["job"], until=lambda v: v.verdict != "")
    round1 = await Verification.objects.aget(id=verify1["job"])
    expected = "unconfirmed" if second == "plausible" else "failed"
    assert round2.verdict == round1.verdict == expected
    for h in (verified, one, two):
        await h.close()


async def test_a_verify_spells_the_sampler_as_floats_whatever_the_renter_sent(
    verifying, api_key
):
    """A renter's ``temperature: 0`` reaches the verifier as 0.0 and a missing
    ``top_p`` as 1.0, as every check does: no spelling tells them apart."""
    verified, verifier = await verified_and_verifier()
    await served(api_key, verified, temperature=0)
    _, verify = await verify_to([verifier])
    temperature, top_p = verify["params"]["temperature"], verify["params"]["top_p"]
    assert (temperature, top_p) == (0.0, 1.0)
    assert isinstance(temperature, float) and isinstance(top_p, float)
    await verified.close()
    await verifier.close()
