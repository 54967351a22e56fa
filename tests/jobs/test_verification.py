"""Verification of real answers, the coordinator's side (DESIGN.md "Verifying
real answers"; issue 22 item 4): a renter's answer chosen at its job's end is
sent as a ``verify`` to a device of another owner only, its ``scores`` judged,
paid from ``platform_checks`` against a valid receipt, and two implausible
verdicts of two owners fail the verified host as a failed spot check would.

The verifiers are scripted hosts answering hand-built scores (a legitimate
double: the agent's prefill scorer is tested with the real model in
tests/agent); the judge is ``jobs.verification.plausibility``'s.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from billing.models import Earning, Entry, LedgerTransaction
from billing.money import share_of
from hosts.models import Device, DeviceOutcome
from hosts.services import machine_create
from jobs.models import Job, Verification
from jobs.tokens import token_count
from jobs.verification.records import verifications_expire
from tests.hostsim import MODEL, HostSim

from .helpers import chat_request, heartbeat_applied

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

ANSWER = ["Hello", " there, how can I help?"]
PLAUSIBLE = {"rank": 0, "logprob": -1.0, "mean": -1.0, "var": 1.0}
IMPLAUSIBLE = {"rank": 7, "logprob": -12.0, "mean": -1.0, "var": 1.0}


@pytest.fixture
def verifying(settings, catalog):
    """Every renter's answer verified (the rate forced to 1); no spot checks."""
    settings.BALLAST_VERIFY_RATE = 1.0
    settings.BALLAST_SPOT_CHECKS = False
    return settings


async def _host(email: str, name: str, *, verifies: bool, score: int) -> HostSim:
    """A scripted host of owner ``email`` online with the model loaded; its
    device's ``score`` set (the verified host ranks first for the renter)."""
    machine, token = await database_sync_to_async(machine_create)(
        owner_email=email, name=name
    )
    host = HostSim(token, verifies=verifies)
    await host.connect()
    await host.heartbeat()
    await heartbeat_applied(machine)
    await Device.objects.filter(machine=machine).aupdate(score=score)
    host.machine = machine
    return host


async def _served(api_key: str, host: HostSim) -> dict:
    """A renter's non-streamed chat answered by ``host``; return its offer."""
    request = chat_request(api_key, stream=False)
    offer = await host.recv_type("offer")
    await host.answer(offer, ANSWER)
    response = await request
    assert response.status_code == 200, response.content
    return offer


async def _verify_to(hosts: list[HostSim], timeout: float = 5.0):
    """The first ``verify`` frame any of ``hosts`` receives: (host, frame)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        for host in hosts:
            if not await host.ws.receive_nothing(timeout=0.02):
                frame = await host.recv()
                if frame["type"] == "verify":
                    return host, frame
    raise AssertionError("no verify frame reached any verifier")


def _tokens(verify: dict, entry: dict) -> list[dict]:
    """One hand-built score per token of the answer (the tokenizer's count)."""
    n = token_count(MODEL, verify["answer"]) or len(verify["answer"])
    return [dict(entry) for _ in range(n)]


async def _verification(ver_id: str, *, until=lambda v: v.status != "offered"):
    for _ in range(500):
        ver = await Verification.objects.aget(id=ver_id)
        if until(ver):
            return ver
        await asyncio.sleep(0.01)
    raise AssertionError(f"verification {ver_id} stayed {ver.status}")


async def _ledger_balances() -> None:
    total = await Entry.objects.aaggregate(total=Sum("amount_nano"))
    assert (total["total"] or 0) == 0, "every movement balances"


async def test_a_chosen_answer_goes_to_another_owners_verifier_only_and_pays_it(
    verifying, api_key
):
    verified = await _host("a@example.com", "a", verifies=True, score=95)
    own = await _host("a@example.com", "a2", verifies=True, score=60)
    other = await _host("b@example.com", "b", verifies=True, score=60)
    offer = await _served(api_key, verified)
    host, verify = await _verify_to([verified, own, other])
    assert host is other, "a verifier of another owner, never the verified host's"
    assert verify["answer"] == "".join(ANSWER)
    assert verify["messages"] == [{"role": "user", "content": "Say hello"}]
    assert verify["job"] != offer["job"] and offer["job"] not in str(verify)
    assert set(verify["params"]) == {"temperature", "top_p", "max_tokens", "stop", "seed"}
    tokens = _tokens(verify, PLAUSIBLE)
    await other.send(other.scores_frame(verify, tokens))
    ver = await _verification(verify["job"])
    assert (ver.status, ver.plausible, ver.verdict, ver.round) == (
        "scored",
        True,
        "plausible",
        1,
    )
    assert ver.n == len(tokens) and ver.scored_at is not None
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
    await _ledger_balances()
    for h in (verified, own, other):
        await h.close()


async def test_at_rate_zero_nothing_is_verified(verifying, api_key):
    verifying.BALLAST_VERIFY_RATE = 0.0
    verifying.BALLAST_VERIFY_NEW_RATE = 0.0
    verified = await _host("a@example.com", "a", verifies=False, score=95)
    other = await _host("b@example.com", "b", verifies=True, score=60)
    for _ in range(5):
        await _served(api_key, verified)
    assert await other.ws.receive_nothing(timeout=0.3)
    assert not await Verification.objects.aexists()
    await verified.close()
    await other.close()


async def test_two_implausible_verdicts_of_two_owners_fail_the_host(verifying, api_key):
    verified = await _host("a@example.com", "a", verifies=False, score=95)
    first = await _host("b@example.com", "b", verifies=True, score=60)
    second = await _host("c@example.com", "c", verifies=True, score=60)
    offer = await _served(api_key, verified)
    held = await Earning.objects.aget(attempt_id=offer["job"])
    assert held.status == "held"
    host1, verify1 = await _verify_to([first, second])
    await host1.send(host1.scores_frame(verify1, _tokens(verify1, IMPLAUSIBLE)))
    round1 = await _verification(verify1["job"])
    assert round1.plausible is False and round1.verdict == "confirming"
    await held.arefresh_from_db()
    assert held.status == "held", "one implausible verdict changes nothing yet"
    other = second if host1 is first else first
    host2, verify2 = await _verify_to([other, host1])
    assert host2 is other, "the confirmation goes to a third owner"
    assert verify2["job"] != verify1["job"] and verify2["answer"] == verify1["answer"]
    await host2.send(host2.scores_frame(verify2, _tokens(verify2, IMPLAUSIBLE)))
    round2 = await _verification(verify2["job"], until=lambda v: v.verdict != "")
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
    await _ledger_balances()
    for h in (verified, first, second):
        await h.close()


async def test_a_lone_implausible_verdict_changes_nothing_for_the_host(
    verifying, api_key
):
    verified = await _host("a@example.com", "a", verifies=False, score=95)
    lone = await _host("b@example.com", "b", verifies=True, score=60)
    offer = await _served(api_key, verified)
    device = await Device.objects.aget(machine=verified.machine)
    _, verify = await _verify_to([lone])
    await lone.send(lone.scores_frame(verify, _tokens(verify, IMPLAUSIBLE)))
    ver = await _verification(verify["job"], until=lambda v: v.verdict != "")
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
    await verified.close()
    await lone.close()


@pytest.mark.parametrize("failure", ["error", "malformed", "bad receipt", "expiry"])
async def test_a_verifiers_failure_counts_against_it_only(verifying, api_key, failure):
    verified = await _host("a@example.com", "a", verifies=False, score=95)
    verifier = await _host("b@example.com", "b", verifies=True, score=60)
    offer = await _served(api_key, verified)
    job_before = await Job.objects.aget(attempts__id=offer["job"])
    _, verify = await _verify_to([verifier])
    if failure == "error":
        await verifier.send({"type": "error", "job": verify["job"], "message": "no"})
    elif failure == "malformed":
        tokens = _tokens(verify, PLAUSIBLE)
        tokens[0] = {"rank": -1, "logprob": 1.5, "mean": "x", "var": None}
        await verifier.send(verifier.scores_frame(verify, tokens))
        assert (await verifier.recv_type("error"))["message"]
    elif failure == "bad receipt":
        frame = verifier.scores_frame(verify, _tokens(verify, PLAUSIBLE))
        frame["receipt"] = verifier.scores_frame(
            {**verify, "answer": "another text"}, _tokens(verify, PLAUSIBLE)
        )["receipt"]
        await verifier.send(frame)
    else:
        later = timezone.now() + timedelta(seconds=settings.BALLAST_VERIFY_DEADLINE_S + 1)
        await _verification(verify["job"], until=lambda v: v.sent_at is not None)
        assert await database_sync_to_async(verifications_expire)(now=later) == 1
    ver = await _verification(verify["job"])
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
    await _ledger_balances()
    await verified.close()
    await verifier.close()


async def test_no_verifier_is_recorded_and_nothing_sent(verifying, api_key):
    verified = await _host("a@example.com", "a", verifies=True, score=95)
    not_verifying = await _host("b@example.com", "b", verifies=False, score=60)
    await _served(api_key, verified)
    ver = await _verification_any()
    assert ver.status == "no_verifier" and ver.verifier_id is None
    assert await not_verifying.ws.receive_nothing(timeout=0.2)
    assert await verified.ws.receive_nothing(timeout=0.2)
    await verified.close()
    await not_verifying.close()


async def _verification_any() -> Verification:
    for _ in range(500):
        ver = await Verification.objects.afirst()
        if ver is not None:
            return ver
        await asyncio.sleep(0.01)
    raise AssertionError("no verification stored")


async def test_only_the_verifiers_pages_tell_of_a_verification(verifying, api_key):
    """The verified host's pages show its job as any job (nothing names a
    verification); the verifier's earnings list the prefill it was paid for."""
    from django.test import AsyncClient
    from django.urls import reverse

    verified = await _host("a@example.com", "a", verifies=False, score=95)
    verifier = await _host("b@example.com", "b", verifies=True, score=60)
    await _served(api_key, verified)
    _, verify = await _verify_to([verifier])
    await verifier.send(verifier.scores_frame(verify, _tokens(verify, PLAUSIBLE)))
    await _verification(verify["job"])
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
