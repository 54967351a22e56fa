"""The ends of a fuzzed example (``tests.fuzz.host_run``): the honest renter's
answer and bill, the fuzzing machine's own request, the system settled and the
ledger balanced. Each raises ``Breach``."""

from __future__ import annotations

import asyncio

from channels.db import database_sync_to_async

from tests.hostsim import MODEL
from tests.jobs.helpers import read_body, sse_events, sse_text


class Breach(AssertionError):
    """A property of ``tests.fuzz.host_run``'s module doc that did not hold."""


HONEST_PIECES = ["Hello", " there", ", renter", ": the answer", " is", " 4."]


def tokens(text: str) -> int:
    """The reference model's token count of ``text``."""
    from jobs.tokens import token_count

    return token_count(MODEL, text)


async def honest_answer_checked(response) -> None:
    from jobs.models import Attempt, Job

    if response.status_code != 200:
        raise Breach(
            f"the honest renter got {response.status_code}: {response.content[:300]}"
        )
    events = sse_events(await read_body(response))
    text = sse_text(events)
    if text != "".join(HONEST_PIECES) or events[-1] != "[DONE]":
        raise Breach(f"the honest renter got {text!r}, ending {events[-1]!r}")
    finish = [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]]
    if finish[-1] != "stop":
        raise Breach(f"the honest answer ended {finish[-1]!r}")
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    attempts = [a async for a in Attempt.objects.filter(job=job)]
    billed = tokens("".join(HONEST_PIECES))
    if (
        job.status != Job.Status.SUCCEEDED
        or job.failed_over
        or len(attempts) != 1
        or attempts[0].outcome != Attempt.Outcome.SUCCEEDED
        or job.tokens_billed != billed
        or job.cost_nano != billed * job.price_completion_nano
    ):
        raise Breach(
            f"the honest job {job.id}: {job.status}, failed over {job.failed_over}, "
            f"{len(attempts)} attempt(s), {job.tokens_billed} tokens billed of {billed}"
        )


async def own_answer_checked(counts, response) -> None:
    counts[f"own request {response.status_code}"] += 1
    if response.status_code not in (200, 502, 503, 504):
        raise Breach(
            f"the fuzzing machine's renter got {response.status_code}: {response.content[:300]}"
        )
    if response.status_code == 200:
        events = sse_events(await read_body(response))
        if not events or events[-1] != "[DONE]":
            raise Breach(f"the fuzzing machine's stream ended {events[-1:]}")


async def settled(timeout: float = 30.0) -> None:
    """Wait until no job is open and no slot held; then the ledger balances."""
    from hosts.models import Device
    from jobs.models import Job

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        open_jobs = await Job.objects.filter(status__in=Job.OPEN_STATUSES).acount()
        held = await Device.objects.filter(slots_used__gt=0).acount()
        if not open_jobs and not held:
            break
        if loop.time() > deadline:
            raise Breach(f"{open_jobs} job(s) open, {held} device(s) holding slots")
        await asyncio.sleep(0.02)
    breaches = await database_sync_to_async(ledger_breaches)()
    if breaches:
        raise Breach("; ".join(breaches))


def ledger_breaches() -> list[str]:
    """Unbalanced transactions, and renter accounts whose running balance is not
    the sum of their entries (as tests.chaos.check)."""
    from django.db.models import Sum

    from billing.models import Account, Entry
    from billing.selectors import transactions_unbalanced

    breaches = [f"ledger transaction {t} unbalanced" for t in transactions_unbalanced()]
    for account in Account.objects.filter(kind=Account.Kind.RENTER_CREDIT):
        total = Entry.objects.filter(account=account).aggregate(s=Sum("amount_nano"))[
            "s"
        ]
        if account.balance_nano != (total or 0):
            breaches.append(
                f"account {account.id}: balance {account.balance_nano} != {total}"
            )
    return breaches
