"""Checks of verifiers through the machines' connections (issue 22, the
fresh-eyes review's F1 and F2): a check reaches a verifier on its connection as
any ``verify`` does, a round 2 goes to a trusted verifier, and a round 1 it
contradicts is distrusted (no one account's word fails an honest host).

Scripted hosts answer hand-built scores (as in tests/jobs/test_verification.py).
"""

from __future__ import annotations

import pytest

from hosts.models import Device, DeviceOutcome
from jobs.models import CanaryPrompt, Verification

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
    verifying.BALLAST_VERIFIER_CHECK_DELAY_S = 0
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
        decoy_output="Seine the on Paris, is France of capital The",
    )
    verified = await host_online("a@example.com", "a", verifies=False, score=95)
    verifier = await host_online("b@example.com", "b", verifies=True, score=60)
    await served(api_key, verified)
    _, real = await verify_to([verifier])
    await verifier.send(verifier.scores_frame(real, scores_of(real, PLAUSIBLE)))
    await verification_until(real["job"])
    await verifier.heartbeat()  # the lease tick's poke takes the check due
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


async def test_round_two_goes_to_a_trusted_verifier_who_can_clear_the_host(
    checking, api_key
):
    """One account calls an honest answer implausible; round 2 goes to a
    verifier that passed its checks, which finds it plausible: the host is
    cleared and the first verifier fails a check of its honesty."""
    verified = await host_online("a@example.com", "a", verifies=False, score=95)
    untrusted = await host_online("b@example.com", "b", verifies=True, score=60)
    trusted = [
        await host_online(f"{o}@example.com", o, verifies=True, score=60) for o in "ce"
    ]
    await Device.objects.filter(machine__in=[h.machine for h in trusted]).aupdate(
        verifier_passes=3
    )
    await served(api_key, verified)
    first, verify1 = await verify_to([untrusted, *trusted])
    await first.send(first.scores_frame(verify1, scores_of(verify1, IMPLAUSIBLE)))
    second, verify2 = await verify_to([h for h in (untrusted, *trusted) if h is not first])
    assert second in trusted, "round 2 only to a verifier that passed its checks"
    await second.send(second.scores_frame(verify2, scores_of(verify2, PLAUSIBLE)))
    round2 = await verification_until(verify2["job"], until=lambda v: v.verdict != "")
    assert round2.verdict == "cleared" and round2.verifier_trusted
    assert not await DeviceOutcome.objects.filter(
        device__machine=verified.machine, success=False
    ).aexists(), "the honest host never fails"
    distrusted = await DeviceOutcome.objects.aget(
        device__machine=first.machine, success=False
    )
    assert distrusted.source == "spot_check", "a failed check of its honesty"
    first_device = await Device.objects.aget(machine=first.machine)
    assert first_device.verifier_passes == 0
    for h in (verified, untrusted, *trusted):
        await h.close()
