"""Findings of a hostile walk-through, each kept as the failing input (a regression
test per bug): what must not happen to the money (a host billing past
``max_tokens``, credit overspent, a price changed mid-answer, a job's end lost
with its connection)."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async

from billing.models import Earning
from billing.money import usd_to_nano
from billing.services import renter_top_up
from jobs.models import Attempt, Job
from jobs.tokens import token_count
from tests.hostsim import MODEL

from .helpers import chat_request, host_online, read_body, sse_events, sse_text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_a_host_cannot_send_or_bill_past_max_tokens(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "rig")
    request = chat_request(api_key, stream=False, max_tokens=20)
    offer = await host.recv_type("offer")
    await host.answer(offer, ["x" * 500], tokens=500)
    response = await request
    body = json.loads(response.content)
    assert body["choices"][0]["finish_reason"] == "length"
    text = body["choices"][0]["message"]["content"]
    assert 0 < token_count(MODEL, text) <= 20, "the renter never receives more"
    assert (await host.recv_type("cancel"))["job"] == offer["job"]
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert job.tokens_billed <= 20
    assert job.cost_nano <= 20 * catalog.price_completion_nano
    attempt = await Attempt.objects.aget(job=job)
    assert attempt.receipt_valid is not True, (
        "a host that ignores max_tokens is not paid"
    )
    assert not await Earning.objects.filter(attempt=attempt).aexists()
    await host.close()


async def test_parallel_requests_cannot_overspend_the_credit(catalog, machine_token):
    from hosts.services import user_get_or_create
    from jobs.services import api_key_create

    user = await database_sync_to_async(user_get_or_create)(email="tiny@example.com")
    await database_sync_to_async(renter_top_up)(
        user=user, amount_nano=usd_to_nano("0.000001"), key="tiny"
    )  # enough for 5 tokens at 200 nano-USD
    _, key = await database_sync_to_async(api_key_create)(user=user)
    host = await host_online(machine_token, "rig", slots=8)
    first = chat_request(key, stream=False, max_tokens=5)
    offer = await host.recv_type(
        "offer"
    )  # the first job is running, its worst case reserved
    second = await chat_request(key, stream=False, max_tokens=5)
    assert second.status_code == 402
    await host.answer(offer, ["ok"])
    assert (await first).status_code == 200
    await host.close()


async def test_a_price_change_mid_answer_charges_the_price_the_job_was_admitted_at(
    catalog, machine_token
):
    """Credit for exactly the worst case at the old price; the price rises 500×
    while the answer streams: the renter is charged the admitted price, never
    overdrawn (before: the catalog's price at the end, a balance of −800,000)."""
    from billing.models import Account
    from catalog.models import CatalogModel
    from hosts.services import user_get_or_create
    from jobs.services import api_key_create

    user = await database_sync_to_async(user_get_or_create)(email="exact@example.com")
    await database_sync_to_async(renter_top_up)(
        user=user, amount_nano=1000 * 200, key="exact"
    )  # max_tokens 1000 at 200 nano-USD
    _, key = await database_sync_to_async(api_key_create)(user=user)
    host = await host_online(machine_token, "rig")
    request = chat_request(key, stream=False, max_tokens=1000)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], " the the")
    await CatalogModel.objects.filter(id=catalog.id).aupdate(
        price_completion_nano=100_000
    )
    await host.token(offer["job"], " the")
    await host.done(offer["job"], 3)
    response = await request
    assert response.status_code == 200
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert job.price_completion_nano == 200
    assert job.cost_nano == job.tokens_billed * 200 > 0
    account = await Account.objects.aget(user=user, kind=Account.Kind.RENTER_CREDIT)
    assert account.balance_nano == 1000 * 200 - job.cost_nano >= 0
    await host.close()


async def test_a_lost_database_connection_at_the_end_of_an_answer_is_retried(
    catalog, api_key, machine_token, monkeypatch
):
    """The end of a job whose connection the server closed runs once more: the
    renter gets the whole answer and ``[DONE]``, and is billed once."""
    from django.db import OperationalError

    from billing.models import LedgerTransaction
    from jobs import services

    real_succeed = services.job_succeed
    failures = []

    def succeed_after_a_lost_connection(**kwargs):
        if not failures:
            failures.append(1)
            raise OperationalError(
                "consuming input failed: server closed the connection"
            )
        return real_succeed(**kwargs)

    succeed_after_a_lost_connection.__name__ = "job_succeed"
    monkeypatch.setattr(services, "job_succeed", succeed_after_a_lost_connection)
    host = await host_online(machine_token, "rig")
    request = chat_request(api_key)
    offer = await host.recv_type("offer")
    await host.answer(offer, ["Hello", " there."])
    response = await request
    events = sse_events(await read_body(response))
    assert sse_text(events) == "Hello there." and events[-1] == "[DONE]"
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert failures and job.status == Job.Status.SUCCEEDED and job.cost_nano > 0
    assert await LedgerTransaction.objects.filter(job=job).acount() == 1
    await host.close()
