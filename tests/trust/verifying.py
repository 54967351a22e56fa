"""What the verification tests share: scripted hosts online, a renter's answer
served, the first ``verify`` a verifier receives, hand-built scores, and waits
on a verification's row (events, not sleeps: each polls the database)."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from django.db.models import Sum

from billing.models import Entry
from hosts.models import Device
from hosts.services import machine_create
from jobs.models import Verification
from jobs.tokens import token_count
from tests.hostsim import MODEL, HostSim
from tests.jobs.helpers import chat_request, heartbeat_applied

ANSWER = ["Hello", " there, how can I help?"]
PLAUSIBLE = {"rank": 0, "logprob": -1.0, "mean": -1.0, "var": 1.0}
IMPLAUSIBLE = {"rank": 7, "logprob": -12.0, "mean": -1.0, "var": 1.0}


@pytest.fixture
def verifying(settings, catalog):
    """Every renter's answer verified (the rate forced to 1); no spot checks."""
    settings.BALLAST_VERIFY_RATE = 1.0
    settings.BALLAST_VERIFY_SECOND_SHARE = 0.0  # (a plausible round 1 ends it)
    settings.BALLAST_SPOT_CHECKS = False
    settings.BALLAST_VERIFIER_CHECKS = False  # (tests/trust/test_verifier_checks.py)
    return settings


async def host_online(
    email: str, name: str, *, verifies: bool, score: int, features: tuple[str, ...] = ()
) -> HostSim:
    """A scripted host of owner ``email`` online with the model loaded, its
    engine declaring ``features``; its device's ``score`` set (the verified
    host ranks first for the renter)."""
    machine, token = await database_sync_to_async(machine_create)(
        owner_email=email, name=name
    )
    host = HostSim(token, verifies=verifies, features=features)
    await host.connect()
    await host.heartbeat()
    await heartbeat_applied(machine)
    await Device.objects.filter(machine=machine).aupdate(score=score)
    host.machine = machine
    return host


async def verified_and_verifier() -> tuple[HostSim, HostSim]:
    """Two owners' hosts online: one to serve (ranked first, not verifying)
    and one to verify."""
    verified = await host_online("a@example.com", "a", verifies=False, score=95)
    verifier = await host_online("b@example.com", "b", verifies=True, score=60)
    return verified, verifier


async def served(
    api_key: str,
    host: HostSim,
    *,
    finish_reason: str = "stop",
    tokens: int | None = None,
    **params,
) -> dict:
    """A renter's non-streamed chat (with ``params`` in its body) answered by
    ``host`` ending with ``finish_reason``, reporting ``tokens`` (None: the
    recount); return its offer."""
    request = chat_request(api_key, stream=False, **params)
    offer = await host.recv_type("offer")
    await host.answer(offer, ANSWER, tokens, finish_reason=finish_reason)
    response = await request
    assert response.status_code == 200, response.content
    return offer


async def verify_to(hosts: list[HostSim], timeout: float = 5.0):
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


def scores_of(verify: dict, entry: dict) -> list[dict]:
    """One hand-built score per token of the answer: per id of its
    ``token_ids`` when the frame has them, else the tokenizer's count."""
    if verify.get("token_ids") is not None:
        return [dict(entry) for _ in verify["token_ids"]]
    n = token_count(MODEL, verify["answer"]) or len(verify["answer"])
    return [dict(entry) for _ in range(n)]


async def verification_until(ver_id: str, *, until=lambda v: v.status != "offered"):
    for _ in range(500):
        ver = await Verification.objects.aget(id=ver_id)
        if until(ver):
            return ver
        await asyncio.sleep(0.01)
    raise AssertionError(f"verification {ver_id} stayed {ver.status}")


async def ledger_balances() -> None:
    total = await Entry.objects.aaggregate(total=Sum("amount_nano"))
    assert (total["total"] or 0) == 0, "every movement balances"


async def verification_first() -> Verification:
    for _ in range(500):
        ver = await Verification.objects.afirst()
        if ver is not None:
            return ver
        await asyncio.sleep(0.01)
    raise AssertionError("no verification stored")


