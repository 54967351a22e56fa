"""A claim recorded late (off the token path) never reopens an ended attempt."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction

from jobs.models import Attempt, Job
from jobs.services import attempt_claim, attempt_end, job_create, job_dispatch
from tests.jobs.helpers import sessions_waiting_on_locks

pytestmark = pytest.mark.django_db(transaction=True)


def _offered_attempt(catalog, renter, live_device) -> Attempt:
    device = live_device()
    job = job_create(
        renter=renter,
        api_key=None,
        model=catalog,
        endpoint=Job.Endpoint.CHAT,
        messages=[{"role": "user", "content": "x"}],
        prompt=None,
        params={"max_tokens": 4},
        placement={},
        stream=True,
    )
    attempt = job_dispatch(job=job).attempt
    assert attempt is not None and attempt.device_id == device.id
    return attempt


def test_a_claim_after_the_end_changes_nothing(catalog, renter, live_device):
    attempt = _offered_attempt(catalog, renter, live_device)
    machine_id = str(attempt.device.machine_id)
    attempt_end(attempt_id=str(attempt.id), outcome="host_error")
    assert not attempt_claim(attempt_id=str(attempt.id), machine_id=machine_id)
    attempt.refresh_from_db()
    assert attempt.state == Attempt.State.ENDED and attempt.outcome == "host_error"


def test_a_claim_racing_the_end_never_reopens_the_attempt(catalog, renter, live_device):
    """The end holds the row when the claim's UPDATE starts (PostgreSQL)."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: no such race")
    attempt = _offered_attempt(catalog, renter, live_device)
    machine_id = str(attempt.device.machine_id)
    claimed: list[bool] = []

    def claim() -> None:
        try:
            claimed.append(
                attempt_claim(attempt_id=str(attempt.id), machine_id=machine_id)
            )
        finally:
            connections.close_all()

    with transaction.atomic():
        attempt_end(attempt_id=str(attempt.id), outcome="died_midstream")
        racer = threading.Thread(target=claim)
        racer.start()
        sessions_waiting_on_locks()  # the claim's UPDATE waits for the end to commit
    racer.join(10)
    assert claimed == [False]
    attempt.refresh_from_db()
    assert attempt.state == Attempt.State.ENDED
    assert attempt.outcome == "died_midstream"
