"""``ballast.asgi``'s completions handler, on the production ASGI path: a renter
that goes away (``http.disconnect``) mid-stream, during the request's database
step or before its non-streamed response (billed what its hosts produced)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import pytest_asyncio
from asgiref.testing import ApplicationCommunicator
from channels.db import database_sync_to_async

from ballast.asgi import application

from .helpers import http_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def _completion_sent(
    api_key: str, model: str, content: str, *, stream: bool = True
) -> ApplicationCommunicator:
    """A chat completion (streamed unless ``stream=False``) sent through the
    production ASGI app."""
    body = json.dumps(
        {
            "model": model,
            "stream": stream,
            "messages": [{"role": "user", "content": content}],
        }
    ).encode()
    headers = [(b"authorization", f"Bearer {api_key}".encode())]
    communicator = ApplicationCommunicator(
        application, http_scope("/v1/chat/completions", headers)
    )
    await communicator.send_input({"type": "http.request", "body": body})
    return communicator


async def test_a_renter_going_away_mid_stream_cancels_the_job_and_bills_what_it_got(
    api_key, catalog, machine_token
):
    from jobs.models import Attempt, Job
    from tests.jobs.helpers import host_online

    host = await host_online(machine_token, "rig")
    communicator = await _completion_sent(api_key, catalog.id, "Count")
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], "One,")
    start = await communicator.receive_output(5)
    assert start["status"] == 200
    first = await communicator.receive_output(5)
    assert b'"content":"One,"' in first["body"]
    await communicator.send_input({"type": "http.disconnect"})
    assert (await host.recv_type("cancel"))["job"] == offer["job"]
    await communicator.wait(5)
    attempt = await Attempt.objects.select_related("job", "device").aget(
        id=offer["job"]
    )
    assert attempt.outcome == "cancelled" and attempt.device.slots_used == 0
    assert attempt.job.status == Job.Status.CANCELLED
    assert attempt.job.output_text == "One," and attempt.job.tokens_billed >= 1
    await host.close()


@pytest_asyncio.fixture
async def abandoning(monkeypatch) -> asyncio.Event:
    """Set when a view cancelled during its database step hands the step to
    ``orchestration.channels._job_abandon``."""
    from jobs.orchestration import channels as orchestration

    event = asyncio.Event()
    real_abandon = orchestration._job_abandon

    async def abandon(step):
        event.set()
        await real_abandon(step)

    monkeypatch.setattr(orchestration, "_job_abandon", abandon)
    return event


async def test_a_renter_gone_during_the_database_step_leaves_no_job_holding_a_slot(
    api_key, catalog, machine_token, monkeypatch, abandoning
):
    """The step finishes in its thread after the renter left; what it stored is
    closed at once (cancelled, slot freed, nothing billed), no offer goes out."""
    import asyncio

    from hosts.models import Device
    from jobs import views
    from jobs.models import Job
    from tests.jobs.helpers import host_online

    host = await host_online(machine_token, "rig")
    entered, gate = threading.Event(), threading.Event()
    real_step = views._job_open

    def held_step(*args):
        entered.set()
        gate.wait(10)
        return real_step(*args)

    monkeypatch.setattr(views, "_job_open", held_step)
    communicator = await _completion_sent(api_key, catalog.id, "x")
    assert await asyncio.to_thread(entered.wait, 5)
    await communicator.send_input({"type": "http.disconnect"})
    await asyncio.wait_for(abandoning.wait(), 5)  # the view cancelled mid-step
    gate.set()
    await communicator.wait(5)
    job = await Job.objects.aget()
    assert job.status == Job.Status.CANCELLED and job.cost_nano == 0
    assert await Device.objects.filter(slots_used__gt=0).acount() == 0
    assert await host.ws.receive_nothing(timeout=0.2), "no offer for an abandoned job"
    await host.close()


@pytest_asyncio.fixture
async def relayed(monkeypatch):
    """``relayed(text)``: waits until the job's coroutine took ``text`` from its
    host (``OutputBudget.take``), so a test acts after a token reached the job."""
    from jobs.orchestration.budget import OutputBudget

    taken: list[str] = []
    changed = asyncio.Event()
    real = OutputBudget.take

    def spy(self, text):
        taken.append(text)
        changed.set()
        return real(self, text)

    monkeypatch.setattr(OutputBudget, "take", spy)

    async def wait_for(text: str) -> None:
        async with asyncio.timeout(5):
            while text not in "".join(taken):
                changed.clear()
                await changed.wait()

    return wait_for


@pytest.mark.parametrize("continued", [False, True], ids=["one host", "continuation"])
async def test_a_renter_gone_before_its_non_streamed_response_pays_what_was_produced(
    api_key, catalog, machine_token, fast_deadlines, relayed, continued
):
    """DESIGN.md "Money": a renter who goes away pays for the tokens produced
    up to the cancel, streamed or not (issue 32, item 5). A non-streamed
    answer reaches the renter only in its response; one who left before it is
    billed for what its hosts produced up to the cancel — with the text that
    crossed the cancel, which the host signed in its ``cancelled`` — and that
    host is paid 80 % of its segment against that receipt (the host that died
    sent none and is paid nothing)."""
    from billing.models import Earning, LedgerTransaction
    from billing.money import share_of
    from billing.selectors import transactions_unbalanced
    from hosts.models import Device
    from jobs.models import Attempt, Job
    from jobs.tokens import token_count
    from tests.jobs.helpers import host_online

    first = await host_online(machine_token, "first", score=90)
    second = await host_online(machine_token, "second", score=60)
    communicator = await _completion_sent(api_key, catalog.id, "Count", stream=False)
    offer = await first.recv_type("offer")
    await first.claim(offer["job"])
    await first.token(offer["job"], "One, two,")
    await relayed("One, two,")
    host, job_offer = first, offer
    if continued:
        await first.close()  # gone mid-answer: the continuation takes over
        job_offer = await second.recv_type("offer")
        assert job_offer["continue_from"] == "One, two,"
        host = second
        await host.claim(job_offer["job"])
        await host.token(job_offer["job"], " three,")
        await relayed(" three,")
    await communicator.send_input({"type": "http.disconnect"})
    assert (await host.recv_type("cancel"))["job"] == job_offer["job"]
    await host.token(job_offer["job"], " four,")  # generated before the cancel came
    await host.cancelled(job_offer["job"])  # signs all it sent
    await communicator.wait(5)
    job = await Job.objects.aget(attempts__id=offer["job"])
    assert job.status == Job.Status.CANCELLED
    produced = ["One, two,", " three, four,"] if continued else ["One, two, four,"]
    attempts = [a async for a in Attempt.objects.filter(job=job).order_by("offered_at")]
    assert [a.output_text for a in attempts] == produced
    tokens = [token_count(catalog.id, text) for text in produced]
    assert [a.tokens_billed for a in attempts] == tokens
    assert job.tokens_billed == sum(tokens) > 0
    assert job.cost_nano == sum(tokens) * catalog.price_completion_nano
    charge = await LedgerTransaction.objects.aget(job=job)
    assert charge.kind == "charge"
    paid = tokens[-1] * catalog.price_completion_nano
    earnings = [e async for e in Earning.objects.filter(attempt__job=job)]
    assert [(str(e.attempt_id), e.amount_nano) for e in earnings] == [
        (job_offer["job"], share_of(paid, fast_deadlines.BALLAST_HOST_SHARE))
    ]
    assert await database_sync_to_async(transactions_unbalanced)() == []
    assert await Device.objects.filter(slots_used__gt=0).acount() == 0
    await second.close()
    if not continued:
        await first.close()
