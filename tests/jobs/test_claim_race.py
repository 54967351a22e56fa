"""A claim recorded late (off the token path) never reopens an ended attempt."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction

from jobs.models import Attempt, Job
from jobs.services import attempt_claim, attempt_end, job_create, job_dispatch

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
    attempt = job_dispatch(job_id=str(job.id)).attempt
    assert attempt is not None and attempt.device_id == device.id
    return attempt


def _waiting_on_a_lock(timeout: float = 10.0) -> None:
    """Wait until another session of this database waits for a row lock."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.005)
    raise AssertionError("the claim never waited for the ending attempt's row lock")


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
        _waiting_on_a_lock()  # the claim's UPDATE waits for the end to commit
    racer.join(10)
    assert claimed == [False]
    attempt.refresh_from_db()
    assert attempt.state == Attempt.State.ENDED
    assert attempt.outcome == "died_midstream"
