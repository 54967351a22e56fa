"""Verification of real answers, the coordinator's side (DESIGN.md "Verifying
real answers"; issue 22 item 4): a renter's answer chosen at its job's end is
sent as a ``verify`` to a device of another owner only, its ``scores`` judged,
paid from ``platform_checks`` against a valid receipt, and two implausible
verdicts of two owners fail the verified host as a failed spot check would.

The verifiers are scripted hosts answering hand-built scores (a legitimate
double: the agent's prefill scorer is tested with the real model in
tests/agent); the judge is ``trust.verification.plausibility``'s.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from billing.models import Earning, Entry, LedgerTransaction
from billing.money import share_of
from hosts.models import Device, DeviceOutcome
from jobs.models import Job, Verification
from trust.verification.records import verifications_expire

from .verifying import (  # noqa: F401 (verifying: a fixture)
    ANSWER,
    IMPLAUSIBLE,
    PLAUSIBLE,
    host_online,
    ledger_balances,
    served,
    scores_of,
    verification_until,
    verification_first,
    verify_to,
    verifying,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

async def test_a_chosen_answer_goes_to_another_owners_verifier_only_and_pays_it(
    verifying, api_key
):
    verified = await host_online("a@example.com", "a", verifies=True, score=95)
    own = await host_online("a@example.com", "a2", verifies=True, score=60)
    other = await host_online("b@example.com", "b", verifies=True, score=60)
    offer = await served(api_key, verified)
    host, verify = await verify_to([verified, own, other])
    assert host is other, "a verifier of another owner, never the verified host's"
    assert verify["answer"] == "".join(ANSWER)
    assert verify["messages"] == [{"role": "user", "content": "Say hello"}]
    assert verify["job"] != offer["job"] and offer["job"] not in str(verify)
    assert set(verify["params"]) == {"temperature", "top_p", "max_tokens", "stop", "seed"}
    tokens = scores_of(verify, PLAUSIBLE)
    await other.send(other.scores_frame(verify, tokens))
    ver = await verification_until(verify["job"])
    assert (ver.status, ver.plausible, ver.verdict, ver.round) == (
        "scored",
        True,
        "plausible",
        1,
    )
    assert ver.n == len(tokens) and ver.scored_at is not None
    # paid, but no success on its score: its scores prove no work the
    # coordinator can check (a refuser verifying kept its score up)
    assert not await DeviceOutcome.objects.filter(device__machine=other.machine).aexists()
    job = await Job.objects.aget(id=ver.job_id)
    earning = await Earning.objects.select_related("device").aget(
        device__machine=other.machine
    )
    assert earning.attempt_id is None and earning.status == "held"
    assert earning.amount_nano == ver.paid_nano == share_of(
        len(tokens) * job.price_completion_nano, settings.BALLAST_HOST_SHARE
    ), "paid for the prefill at the host share of the job's price"
    legs = {
        e.account.kind: e.amount_nano
        async for e in Entry.objects.filter(
            transaction__key=f"verify:{ver.id}"
        ).select_related("account")
    }
    assert legs == {"host_held": earning.amount_nano, "platform_checks": -earning.amount_nano}
    # the renter was billed once, for the answer, nothing for its verification
    assert await LedgerTransaction.objects.filter(kind="charge").acount() == 2
    renter_legs = Entry.objects.filter(account__kind="renter_credit", amount_nano__lt=0)
    assert [e.amount_nano async for e in renter_legs] == [-job.cost_nano]
    # the same scores again change nothing (and are refused as not offered)
    await other.send(other.scores_frame(verify, tokens))
    assert (await other.recv_type("error"))["message"].startswith("scores:")
    assert await Earning.objects.filter(device__machine=other.machine).acount() == 1
    for quiet in (verified, own):
        assert await quiet.ws.receive_nothing(timeout=0.2), "told nothing"
    await ledger_balances()
    for h in (verified, own, other):
        await h.close()


async def test_at_rate_zero_nothing_is_verified(verifying, api_key):
    verifying.BALLAST_VERIFY_RATE = 0.0
    verifying.BALLAST_VERIFY_NEW_RATE = 0.0
    verified = await host_online("a@example.com", "a", verifies=False, score=95)
    other = await host_online("b@example.com", "b", verifies=True, score=60)
    for _ in range(5):
        await served(api_key, verified)
    assert await other.ws.receive_nothing(timeout=0.3)
    assert not await Verification.objects.aexists()
    await verified.close()
    await other.close()


async def test_two_implausible_verdicts_of_two_owners_fail_the_host(verifying, api_key):
    verified = await host_online("a@example.com", "a", verifies=False, score=95)
    first = await host_online("b@example.com", "b", verifies=True, score=60)
    second = await host_online("c@example.com", "c", verifies=True, score=60)
    offer = await served(api_key, verified)
    held = await Earning.objects.aget(attempt_id=offer["job"])
    assert held.status == "held"
    host1, verify1 = await verify_to([first, second])
    await host1.send(host1.scores_frame(verify1, scores_of(verify1, IMPLAUSIBLE)))
    round1 = await verification_until(verify1["job"])
    assert round1.plausible is False and round1.verdict == "confirming"
    await held.arefresh_from_db()
    assert held.status == "held", "one implausible verdict changes nothing yet"
    other = second if host1 is first else first
    host2, verify2 = await verify_to([other, host1])
    assert host2 is other, "the confirmation goes to a third owner"
    assert verify2["job"] != verify1["job"] and verify2["answer"] == verify1["answer"]
    await host2.send(host2.scores_frame(verify2, scores_of(verify2, IMPLAUSIBLE)))
    round2 = await verification_until(verify2["job"], until=lambda v: v.verdict != "")
    assert (round2.round, round2.verdict) == (2, "failed")
    await held.arefresh_from_db()
    assert held.status == "reversed", "a failed check reverses held earnings"
    failure = await DeviceOutcome.objects.aget(
        device__machine=verified.machine, source="spot_check"
    )
    assert failure.success is False, "it counts as a failed spot check"
    # both verifiers were paid for their prefill, nothing else moved for the renter
    assert await Earning.objects.filter(attempt__isnull=True).acount() == 2
    assert await verified.ws.receive_nothing(timeout=0.2)
    await ledger_balances()
    for h in (verified, first, second):
        await h.close()


async def test_a_lone_implausible_verdict_changes_nothing_for_the_host(
    verifying, api_key
):
    verified = await host_online("a@example.com", "a", verifies=False, score=95)
    lone = await host_online("b@example.com", "b", verifies=True, score=60)
    offer = await served(api_key, verified)
    device = await Device.objects.aget(machine=verified.machine)
    _, verify = await verify_to([lone])
    # (spot checks on from here, due later than the test lasts)
    verifying.BALLAST_SPOT_CHECKS = True
    verifying.BALLAST_SPOT_CHECK_MAX_DELAY_S = 3600
    await lone.send(lone.scores_frame(verify, scores_of(verify, IMPLAUSIBLE)))
    ver = await verification_until(verify["job"], until=lambda v: v.verdict != "")
    assert ver.plausible is False and ver.verdict == "unconfirmed"
    assert await Verification.objects.filter(round=2, status="no_verifier").aexists()
    held = await Earning.objects.aget(attempt_id=offer["job"])
    assert held.status == "held"
    assert not await DeviceOutcome.objects.filter(
        device=device, source="spot_check"
    ).aexists()
    before = device.score
    await device.arefresh_from_db()
    assert device.score == before and not device.quarantined
    # but its next spot check is due now, not by chance (fresh-eyes review 5)
    assert device.spot_check_reason == "unconfirmed" and device.spot_check_due_at
    await verified.close()
    await lone.close()


@pytest.mark.parametrize("failure", ["error", "malformed", "bad receipt", "expiry"])
async def test_a_verifiers_failure_counts_against_it_only(verifying, api_key, failure):
    verified = await host_online("a@example.com", "a", verifies=False, score=95)
    verifier = await host_online("b@example.com", "b", verifies=True, score=60)
    offer = await served(api_key, verified)
    job_before = await Job.objects.aget(attempts__id=offer["job"])
    _, verify = await verify_to([verifier])
    if failure == "error":
        await verifier.send({"type": "error", "job": verify["job"], "message": "no"})
    elif failure == "malformed":
        tokens = scores_of(verify, PLAUSIBLE)
        tokens[0] = {"rank": -1, "logprob": 1.5, "mean": "x", "var": None}
        await verifier.send(verifier.scores_frame(verify, tokens))
        assert (await verifier.recv_type("error"))["message"]
    elif failure == "bad receipt":
        frame = verifier.scores_frame(verify, scores_of(verify, PLAUSIBLE))
        frame["receipt"] = verifier.scores_frame(
            {**verify, "answer": "another text"}, scores_of(verify, PLAUSIBLE)
        )["receipt"]
        await verifier.send(frame)
    else:
        later = timezone.now() + timedelta(seconds=settings.BALLAST_VERIFY_DEADLINE_S + 1)
        await verification_until(verify["job"], until=lambda v: v.sent_at is not None)
        assert await database_sync_to_async(verifications_expire)(now=later) == 1
    ver = await verification_until(verify["job"])
    assert ver.status == ("expired" if failure == "expiry" else "refused")
    assert ver.plausible is None and ver.verdict == ""
    against = await DeviceOutcome.objects.aget(device__machine=verifier.machine)
    assert against.success is False and against.reason.startswith("verify_")
    assert not await DeviceOutcome.objects.filter(
        device__machine=verified.machine, success=False
    ).aexists(), "never against the verified host"
    assert not await Earning.objects.filter(device__machine=verifier.machine).aexists()
    job = await Job.objects.aget(id=job_before.id)
    assert (job.status, job.cost_nano) == (job_before.status, job_before.cost_nano)
    assert (await Earning.objects.aget(attempt_id=offer["job"])).status == "held"
    await ledger_balances()
    await verified.close()
    await verifier.close()


async def test_no_verifier_is_recorded_and_nothing_sent(verifying, api_key):
    verified = await host_online("a@example.com", "a", verifies=True, score=95)
    not_verifying = await host_online("b@example.com", "b", verifies=False, score=60)
    await served(api_key, verified)
    ver = await verification_first()
    assert ver.status == "no_verifier" and ver.verifier_id is None
    assert await not_verifying.ws.receive_nothing(timeout=0.2)
    assert await verified.ws.receive_nothing(timeout=0.2)
    await verified.close()
    await not_verifying.close()


async def test_only_the_verifiers_pages_tell_of_a_verification(verifying, api_key):
    """The verified host's pages show its job as any job (nothing names a
    verification); the verifier's earnings list the prefill it was paid for."""
    from django.test import AsyncClient
    from django.urls import reverse

    verified = await host_online("a@example.com", "a", verifies=False, score=95)
    verifier = await host_online("b@example.com", "b", verifies=True, score=60)
    await served(api_key, verified)
    _, verify = await verify_to([verifier])
    await verifier.send(verifier.scores_frame(verify, scores_of(verify, PLAUSIBLE)))
    await verification_until(verify["job"])
    pages = {}
    for host in (verified, verifier):
        machine = await host.machine.__class__.objects.select_related("owner").aget(
            id=host.machine.id
        )
        client = AsyncClient()
        await client.aforce_login(machine.owner)
        for name, url in (
            ("earnings", reverse("billing:earnings")),
            ("machine", reverse("hosts:machine", args=[machine.id])),
        ):
            response = await client.get(url)
            assert response.status_code == 200
            pages[host is verifier, name] = response.content.decode().lower()
    assert "verification of an answer" in pages[True, "earnings"]
    for name in ("earnings", "machine"):
        assert "verif" not in pages[False, name], f"the verified host's {name} page"
    await verified.close()
    await verifier.close()
