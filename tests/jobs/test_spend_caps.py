"""Spending caps per API key: a request the cap cannot cover at its worst case
is refused with 402 ``key_spend_cap_reached`` in the request's transaction and
sends nothing to any host; what the key was charged is counted per period
(UTC day, calendar month, ever) from the charges themselves."""

from __future__ import annotations

from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from channels.db import database_sync_to_async

from jobs.models import ApiKey, Job
from jobs.services import api_key_cap_set, api_key_create, key_spend_add

from .helpers import chat_request, host_online

SECRET = "a prompt no host may see past the cap"
PRICE = 200  # nano-USD per output token of the reference model


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_capped_key_is_refused_past_its_cap_and_sends_nothing(
    catalog, renter, machine_token
):
    """Cap 25,000 nano-USD a day. After a first job charged S, the largest
    max_tokens m with S + 200 m ≤ 25,000 is admitted and m + 1 is refused
    before any host sees it; another key of the same renter is not capped."""

    def keys():
        capped, plain = api_key_create(user=renter, name="capped")
        api_key_cap_set(
            user=renter, key_id=capped.id, cap_nano=25_000, period=ApiKey.Period.DAY
        )
        return plain, api_key_create(user=renter, name="free")[1]

    capped, free = await database_sync_to_async(keys)()
    host = await host_online(machine_token, "rig")

    first = chat_request(capped, stream=False, max_tokens=100)
    offer = await host.recv_type("offer")
    await host.answer(offer, ["Hello", " there", ", friend"])
    assert (await first).status_code == 200
    key = await ApiKey.objects.aget(name="capped")
    job = await Job.objects.aget(api_key=key)
    assert key.spent_nano == job.cost_nano > 0
    fits = (25_000 - key.spent_nano) // PRICE

    refused = await chat_request(capped, content=SECRET, max_tokens=fits + 1)
    assert refused.status_code == 402
    error = refused.json()["error"]
    assert error["code"] == "key_spend_cap_reached"
    assert error["type"] == "insufficient_quota"
    assert "0.000025 USD per day (UTC) is reached" in error["message"]
    assert await host.ws.receive_nothing(timeout=0.3), "a frame reached the host"
    assert not await Job.objects.filter(messages__0__content=SECRET).aexists()

    for plain, max_tokens in ((capped, fits), (free, 1000)):
        admitted = chat_request(plain, stream=False, max_tokens=max_tokens)
        offer = await host.recv_type("offer")
        await host.answer(offer, ["ok"])
        assert (await admitted).status_code == 200
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_open_jobs_of_the_key_count_against_its_cap(
    catalog, renter, machine_token
):
    """A job still running holds its worst case: a second request that would
    pass the cap together with it is refused."""

    def key():
        made, plain = api_key_create(user=renter, name="two-at-once")
        api_key_cap_set(user=renter, key_id=made.id, cap_nano=30_000)
        return plain

    plain = await database_sync_to_async(key)()
    host = await host_online(machine_token, "rig", slots=2)
    running = chat_request(plain, stream=False, max_tokens=100)  # holds 20,000
    offer = await host.recv_type("offer")
    second = await chat_request(plain, content=SECRET, max_tokens=51)  # 10,200
    assert second.status_code == 402
    assert second.json()["error"]["code"] == "key_spend_cap_reached"
    await host.answer(offer, ["ok"])
    assert (await running).status_code == 200
    assert await host.ws.receive_nothing(timeout=0.3)
    await host.close()


@pytest.mark.django_db
def test_the_counter_restarts_with_each_period(renter):
    key, _ = api_key_create(user=renter)
    noon = datetime(2026, 12, 1, 12, tzinfo=dt_timezone.utc)
    for period, later, kept in (
        (ApiKey.Period.DAY, timedelta(hours=11), 300),  # still 1 Dec
        (ApiKey.Period.DAY, timedelta(hours=13), 0),  # 2 Dec: a new day
        (ApiKey.Period.MONTH, timedelta(days=29), 300),  # 30 Dec
        (ApiKey.Period.MONTH, timedelta(days=31), 0),  # 1 Jan
        (ApiKey.Period.TOTAL, timedelta(days=400), 300),
    ):
        api_key_cap_set(
            user=renter, key_id=key.id, cap_nano=10**6, period=period, now=noon
        )
        key_spend_add(key_id=key.id, cost_nano=100, now=noon)
        key_spend_add(key_id=key.id, cost_nano=200, now=noon)
        key.refresh_from_db()
        assert key.spent_in_period_nano(noon) == 300
        assert key.spent_in_period_nano(noon + later) == kept, (period, later)
        key_spend_add(key_id=key.id, cost_nano=50, now=noon + later)
        key.refresh_from_db()
        assert key.spent_in_period_nano(noon + later) == kept + 50


@pytest.mark.django_db
def test_setting_a_cap_counts_what_the_key_was_charged_in_the_period(renter):
    key, _ = api_key_create(user=renter)
    now = datetime(2026, 12, 15, tzinfo=dt_timezone.utc)
    for days, cost in ((3, 700), (20, 90)):
        Job.objects.create(
            renter=renter,
            api_key=key,
            model_id="m",
            endpoint="chat",
            status=Job.Status.SUCCEEDED,
            cost_nano=cost,
            finished_at=now - timedelta(days=days),
        )
    key = api_key_cap_set(user=renter, key_id=key.id, cap_nano=1000, now=now)
    assert key.spent_nano == 700  # December's
    key = api_key_cap_set(
        user=renter, key_id=key.id, cap_nano=1000, period="total", now=now
    )
    assert key.spent_nano == 790
    key = api_key_cap_set(user=renter, key_id=key.id, cap_nano=None, now=now)
    assert key.spend_cap_nano is None
    key_spend_add(key_id=key.id, cost_nano=5, now=now)  # uncapped: not counted
    key.refresh_from_db()
    assert key.spent_nano == 700
    with pytest.raises(ValueError):
        api_key_cap_set(user=renter, key_id=key.id, cap_nano=-1, now=now)
    with pytest.raises(ValueError):
        api_key_cap_set(user=renter, key_id=key.id, cap_nano=1, period="week")


@pytest.mark.django_db
def test_a_renter_sets_a_cap_on_their_page(client, renter, stranger):
    from django.urls import reverse

    key, _ = api_key_create(user=renter, name="ci")
    other, _ = api_key_create(user=stranger, name="theirs")
    client.force_login(renter)
    url = reverse("renter:key_cap_set")
    page = client.post(url, {"key": key.id, "cap_usd": "2.5", "period": "day"})
    assert page.status_code == 302
    key.refresh_from_db()
    assert key.spend_cap_nano == 2_500_000_000 and key.spend_cap_period == "day"
    html = client.get(reverse("renter:overview")).content.decode()
    assert "$2.50</span> per day (UTC)" in html
    refused = client.post(url, {"key": other.id, "cap_usd": "1", "period": "day"})
    assert refused.status_code == 400  # not theirs: not a choice
    other.refresh_from_db()
    assert other.spend_cap_nano is None
    client.post(url, {"key": key.id, "cap_usd": "", "period": "day"})
    key.refresh_from_db()
    assert key.spend_cap_nano is None
