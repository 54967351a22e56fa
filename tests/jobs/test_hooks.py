"""What jobs tells the checks of hosts' honesty, and asks them, goes through one
hook jobs owns (``jobs.hooks``): ``trust`` is the receiver registered when
Django starts; without one, every answer is on the safe side."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from jobs.hooks import TrustHook, hook, hook_register
from jobs.models import Rental
from trust.hooks import Trust

pytestmark = pytest.mark.django_db


@pytest.fixture
def without_trust():
    """jobs alone: no receiver registered (the hook's defaults answer)."""
    registered = hook()
    hook_register(TrustHook())
    yield
    hook_register(registered)


def test_trust_is_the_receiver_registered_when_django_starts():
    assert isinstance(hook(), Trust)


def test_without_trust_a_rental_is_refused_as_no_check_would_come(
    live_device, api_key, without_trust
):
    """A rental starts only after a passed spot check: with no checks, it is
    refused up front rather than left pending for ever."""
    device = live_device("plain")
    answer = Client().post(
        "/v1/rentals",
        data={"device": device.id, "hours": 1},
        content_type="application/json",
        headers={"authorization": f"Bearer {api_key}"},
    )
    assert answer.status_code == 409, answer.content
    error = json.loads(answer.content)["error"]
    assert error["code"] == "device_unchecked"
    assert "this coordinator runs no spot checks" in error["message"]
    assert not Rental.objects.exists()


def test_without_trust_an_end_is_told_to_no_one():
    """The defaults: an attempt's end sets nothing to verify (its fields left
    as they are), a job's end has nothing to start after its commit."""

    class Ended:
        exemption = "untouched"

    attempt = Ended()
    assert TrustHook().attempt_ended(attempt=attempt, token_ids=[1], now=None) is None
    assert attempt.exemption == "untouched"
    assert TrustHook().job_ended(job=None, attempts=[], now=None) is None
