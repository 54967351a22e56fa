"""``GET /metrics`` (ballast.metrics, ballast.metrics_view, docs/metrics.md):
scraped through the ASGI application after real requests from scripted hosts,
parsed with prometheus-client's own parser; reached by staff only."""

from __future__ import annotations

import asyncio

import pytest
from django.test import AsyncClient
from prometheus_client.parser import text_string_to_metric_families

from tests.hostsim import MODEL

from .helpers import chat_request, host_online, read_body, right_answer
from .helpers import verdict as _verdict

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

TOKEN = "metrics-secret-token"


@pytest.fixture
def metrics_token(settings):
    settings.BALLAST_METRICS_TOKEN = TOKEN


async def scrape() -> dict[tuple[str, frozenset], float]:
    """Every sample of one scrape: (name, labels) -> value."""
    response = await AsyncClient().get(
        "/metrics", headers={"authorization": f"Bearer {TOKEN}"}
    )
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


async def test_it_counts_a_failed_over_request_and_shows_capacity(
    catalog, api_key, machine_token, fast_deadlines, metrics_token
):
    bad = await host_online(machine_token, "bad", score=90)
    good = await host_online(machine_token, "good", score=60)
    before = await scrape()
    assert value(before, "ballast_devices_online", model=MODEL) == 2
    assert value(before, "ballast_slots_free", model=MODEL) == 2
    request = chat_request(api_key)
    offer = await bad.recv_type("offer")
    await bad.claim(offer["job"])
    await bad.token(offer["job"], "Hel")
    response = await request
    body = asyncio.create_task(read_body(response))  # the renter keeps reading
    await bad.close()  # dies mid-stream: the good host continues the answer
    second = await good.recv_type("offer")
    assert second["continue_from"] == "Hel"
    await good.answer(second, ["lo there"])
    await body
    after = await scrape()
    assert value(after, "ballast_devices_online", model=MODEL) == 1

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("ballast_requests_total", model=MODEL, status="succeeded") == 1
    assert delta("ballast_failovers_total", model=MODEL) == 1
    assert delta("ballast_attempts_total", outcome="died_midstream", kind="fresh") == 1
    assert (
        delta("ballast_attempts_total", outcome="succeeded", kind="continuation") == 1
    )
    assert delta("ballast_time_to_first_token_seconds_count", model=MODEL) == 1
    assert delta("ballast_queue_wait_seconds_count", model=MODEL) == 1
    assert delta("ballast_queue_wait_seconds_bucket", model=MODEL, le="+Inf") == 1
    assert total(after, "ballast_money_posted_nano_usd_total") > total(
        before, "ballast_money_posted_nano_usd_total"
    ), "the renter's charge is money posted"
    await good.close()


async def test_it_counts_spot_checks_by_result(canaries, machine_token, metrics_token):
    before = await scrape()
    host = await host_online(machine_token, "rig")  # the first load is checked
    offer = await host.recv_type("offer")
    await host.answer(offer, [await right_answer(offer)])
    await _verdict(offer["job"])
    after = await scrape()
    passed = ("ballast_spot_checks_total", "passed")
    assert (
        value(after, passed[0], result="passed")
        - value(before, passed[0], result="passed")
        == 1
    )
    assert value(after, "ballast_requests_total", model=MODEL, status="succeeded") == (
        value(before, "ballast_requests_total", model=MODEL, status="succeeded")
    ), "a spot check is not a renter's request"
    await host.close()


async def test_only_staff_reach_the_metrics(
    catalog, owner, metrics_token, django_user_model
):
    client = AsyncClient()
    assert (await client.get("/metrics")).status_code == 404
    wrong = await client.get("/metrics", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 404
    await client.aforce_login(owner)
    assert (await client.get("/metrics")).status_code == 404, "not staff"
    staff = await django_user_model.objects.acreate(
        username="ops", email="ops@example.com", is_staff=True
    )
    await client.aforce_login(staff)
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert b"ballast_devices_online" in response.content


async def test_no_token_set_means_staff_only(catalog, settings):
    settings.BALLAST_METRICS_TOKEN = ""
    empty = await AsyncClient().get("/metrics", headers={"authorization": "Bearer "})
    assert empty.status_code == 404
