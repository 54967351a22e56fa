"""Prices in /v1/models, 402 before dispatch, balance and charges in /v1/usage."""

from __future__ import annotations

import pytest
from django.test import Client

from billing.services import renter_top_up
from hosts.services import user_get_or_create
from jobs.models import Job
from jobs.services import api_key_create
from tests.hostsim import MODEL

pytestmark = pytest.mark.django_db(transaction=True)


def _renter_with(nano: int) -> str:
    user = user_get_or_create(email=f"r{nano}@example.com")
    if nano:
        renter_top_up(user=user, amount_nano=nano, key=f"top-up-{nano}")
    return api_key_create(user=user)[1]


def _post(key: str, max_tokens: int):
    return Client().post(
        "/v1/chat/completions",
        data={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
        },
        content_type="application/json",
        headers={"authorization": f"Bearer {key}"},
    )


def test_it_shows_prices_per_token_in_usd(catalog, model13b, api_key):
    response = Client().get(
        "/v1/models", headers={"authorization": f"Bearer {api_key}"}
    )
    pricing = {m["id"]: m["pricing"] for m in response.json()["data"]}
    assert pricing[MODEL] == {"prompt": "0", "completion": "0.0000002"}
    assert pricing["test-13b"] == {"prompt": "0.00000005", "completion": "0.000000333"}


def test_it_answers_402_before_dispatch_when_credit_cannot_cover_max_tokens(catalog):
    """100 tokens × 200 nano-USD = 20000 needed; 19999 is refused, nothing is stored."""
    key = _renter_with(19_999)
    response = _post(key, 100)
    assert response.status_code == 402
    assert response.json()["error"]["code"] == "insufficient_credit"
    assert not Job.objects.exists()


def test_it_admits_a_request_the_credit_covers_exactly(catalog):
    """With 20000 nano-USD, max_tokens=100 passes the credit check (then 503: no host)."""
    key = _renter_with(20_000)
    response = _post(key, 100)
    assert response.status_code == 503
    assert Job.objects.count() == 1


def test_it_answers_402_to_a_renter_without_credit(catalog):
    assert _post(_renter_with(0), 1).status_code == 402


def test_it_shows_the_balance_and_recent_charges(rig, renter, api_key):
    job = rig.job(renter=renter, model="test-13b")
    rig.segment(job, text="abcdefghij", tokens=7)
    rig.finish(job)
    body = (
        Client().get("/v1/usage", headers={"authorization": f"Bearer {api_key}"}).json()
    )
    assert body["balance"] == "4.999997669"
    assert body["recent"][0]["job"] == str(job.id)
    assert body["recent"][0]["tokens"] == 7
    assert body["recent"][0]["cost"] == "0.000002331"


def test_recent_charges_are_the_newest_first(rig, renter, api_key):
    jobs = []
    for _ in range(3):
        job = rig.job(renter=renter, model="test-13b")
        rig.segment(job, text="abc", tokens=2)
        rig.finish(job)
        jobs.append(job)
    body = (
        Client().get("/v1/usage", headers={"authorization": f"Bearer {api_key}"}).json()
    )
    assert [charge["job"] for charge in body["recent"]] == [
        str(job.id) for job in reversed(jobs)
    ]
