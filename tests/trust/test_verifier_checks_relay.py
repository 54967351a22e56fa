"""Checks of verifiers through the machines' connections (issue 22, the
fresh-eyes review's F1 and F2): a check reaches a verifier on its connection as
any ``verify`` does, a round 2 goes to a trusted verifier, and a round 1 it
contradicts is distrusted (no one account's word fails an honest host).

Scripted hosts answer hand-built scores (as in tests/trust/test_verification.py).
"""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from hosts.models import Device, DeviceOutcome
from jobs.models import CanaryPrompt, Verification
from trust.verification.checks import verifier_checks_plan

from .verifying import (  # noqa: F401 (verifying: a fixture)
    IMPLAUSIBLE,
    PLAUSIBLE,
    host_online,
    scores_of,
    served,
    verification_until,
    verify_to,
    verifying,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def checking(verifying):
    """Every answer verified, checks of verifiers sent as soon as planned, and
    every heartbeat a lease tick (so it takes the checks due)."""
    verifying.BALLAST_VERIFIER_CHECKS = True
    verifying.BALLAST_VERIFIER_CHECK_NEW_EVERY_S = 0.001  # planned at each plan
    verifying.BALLAST_VERIFIER_TRUST_PASSES = 3
    verifying.BALLAST_HEARTBEAT_INTERVAL_S = verifying.BALLAST_HEARTBEAT_MAX_AGE_S / 2
    return verifying


async def test_a_check_reaches_the_verifier_like_any_verify_and_is_judged(
    checking, api_key
):
    await CanaryPrompt.objects.acreate(
        model_id="smollm2-135m-instruct",
        index=1,
        messages=[{"role": "user", "content": "Which city is the capital of France?"}],
        params={"max_tokens": 64, "temperature": 0},
        expected="Paris",
        status="calibrated",
        reference_output="The capital of France is Paris, on the Seine.",
        check_temperature=0.0,
        check_output="The capital of France is Paris, on the Seine.",
        decoy_output="Seine the on Paris, is France of capital The",
    )
    verified = await host_online("a@example.com", "a", verifies=False, score=95)
    verifier = await host_online("b@example.com", "b", verifies=True, score=60)
    await served(api_key, verified)
    _, real = await verify_to([verifier])
    await verifier.send(verifier.scores_frame(real, scores_of(real, PLAUSIBLE)))
    await verification_until(real["job"])
    # beat plans it on its own clock (due within a millisecond here); the
    # lease tick's poke at the next heartbeat sends it
    assert await database_sync_to_async(verifier_checks_plan)(every_s=0.001) == 1
    await verifier.heartbeat()
    _, check = await verify_to([verifier])
    assert set(check) == set(real), "the same frame, field for field"
    ver = await Verification.objects.aget(id=check["job"])
    assert ver.canary_id is not None and ver.job_id is None
    entry = PLAUSIBLE if ver.expected_plausible else IMPLAUSIBLE
    await verifier.send(verifier.scores_frame(check, scores_of(check, entry)))
    ver = await verification_until(check["job"])
    assert ver.verdict == "passed"
    device = await Device.objects.aget(machine=verifier.machine)
    assert device.verifier_passes == 1
    assert await verified.ws.receive_nothing(timeout=0.2), "the verified host hears nothing"
    await verified.close()
    await verifier.close()


async def _trusted_fleet(api_key):
    """A host serving one renter's answer and three verifiers of three other
    owners, all trusted (they passed their checks)."""
    verified = await host_online("a@example.com", "a", verifies=False, score=95)
    verifiers = [
        await host_online(f"{o}@example.com", o, verifies=True, score=60) for o in "bce"
    ]
    await Device.objects.filter(machine__in=[h.machine for h in verifiers]).aupdate(
        verifier_passes=3
    )
    await served(api_key, verified)
    return verified, verifiers


async def _round(verifiers, asked, entry):
    """The next ``verify`` among the verifiers not ``asked`` yet, answered
    with ``entry`` scores (or an ``error`` when ``entry`` is None)."""
    host, frame = await verify_to([h for h in verifiers if h not in asked])
    asked.append(host)
    if entry is None:
        await host.send({"type": "error", "job": frame["job"], "message": "busy"})
    else:
        await host.send(host.scores_frame(frame, scores_of(frame, entry)))
    return host, frame


@pytest.mark.parametrize(
    "says, verdict",
    [
        # a liar calls an honest answer implausible: outvoted by two
        ((IMPLAUSIBLE, PLAUSIBLE, PLAUSIBLE), "cleared"),
        # a colluder calls a cheat's answer plausible: outvoted by two
        ((IMPLAUSIBLE, PLAUSIBLE, IMPLAUSIBLE), "failed"),
        # a colluder refuses its round: the next verifier is asked
        ((IMPLAUSIBLE, None, IMPLAUSIBLE), "failed"),
    ],
    ids=["liar in round 1", "colluder in round 2", "colluder refuses"],
)
async def test_rounds_go_on_until_two_agree_and_the_outvoted_loses_its_trust(
    checking, api_key, says, verdict
):
    verified, verifiers = await _trusted_fleet(api_key)
    asked, frames = [], []
    for entry in says:
        frames.append((await _round(verifiers, asked, entry))[1])
    last = await verification_until(frames[-1]["job"], until=lambda v: v.verdict != "")
    rounds = [v async for v in Verification.objects.filter(job_id=last.job_id)]
    assert {v.verdict for v in rounds} == {verdict} and len(rounds) == 3
    host_failed = await DeviceOutcome.objects.filter(
        device__machine=verified.machine, success=False
    ).aexists()
    assert host_failed == (verdict == "failed")
    outvoted = [h for h, e in zip(asked, says) if e is not None and e is not (
        PLAUSIBLE if verdict == "cleared" else IMPLAUSIBLE
    )]
    for host in asked:
        device = await Device.objects.aget(machine=host.machine)
        was_outvoted = await DeviceOutcome.objects.filter(
            device=device, reason="verify_outvoted", success=False
        ).aexists()
        assert was_outvoted == (host in outvoted), host.machine.name
        assert (device.verifier_passes == 0) == (host in outvoted)
        assert not await DeviceOutcome.objects.filter(
            device=device, source="spot_check", success=False
        ).aexists(), "no one fails a check of its honesty by a vote"
    for h in (verified, *verifiers):
        await h.close()


async def test_a_round_that_expires_is_asked_of_the_next_verifier(checking, api_key):
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from trust.verification.records import verifications_expire

    verified, verifiers = await _trusted_fleet(api_key)
    asked: list = []
    await _round(verifiers, asked, IMPLAUSIBLE)
    silent, frame = await verify_to([h for h in verifiers if h not in asked])
    asked.append(silent)
    await verification_until(frame["job"], until=lambda v: v.sent_at is not None)
    # its deadline passed (the clock stays now: the fleet is live)
    past = timezone.now() - timedelta(seconds=settings.BALLAST_VERIFY_DEADLINE_S + 1)
    await Verification.objects.filter(id=frame["job"]).aupdate(offered_at=past)
    assert await database_sync_to_async(verifications_expire)() == 1
    third, frame3 = await verify_to([h for h in verifiers if h not in asked])
    ver3 = await Verification.objects.aget(id=frame3["job"])
    assert ver3.round == 3 and frame3["answer"] == frame["answer"]
    for h in (verified, *verifiers):
        await h.close()
