"""A running job's lease (issue 23, item 7), on the real ASGI app: a transient
database error does not stop its renewal; a lease actually lost (the reaper
closed the job) is noticed by the job's own coroutine, which stops and tells the
host to cancel."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.db import OperationalError, transaction
from django.utils import timezone

from jobs import services
from jobs.models import Attempt, Job
from jobs.orchestration import lease

from .helpers import chat_request, host_online, read_body, sse_events, sse_text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def fast_lease(monkeypatch):
    monkeypatch.setattr(lease, "LEASE_RENEW_S", 0.02)
    monkeypatch.setattr(lease, "LEASE_RETRY_PAUSE_S", 0.001)


async def test_a_transient_database_error_does_not_stop_the_lease(
    catalog, api_key, machine_token, monkeypatch, fast_lease
):
    """Five renewals fail in a row (more than one round of retries); the next
    ones extend the lease again, and the answer completes."""
    loop = asyncio.get_running_loop()
    renewed_after_failures = asyncio.Event()
    real_renew = services.job_lease_renew
    failures = []

    def renew_after_failures(**kwargs):
        if len(failures) < 5:
            failures.append(1)
            raise OperationalError("server closed the connection unexpectedly")
        renewed = real_renew(**kwargs)
        loop.call_soon_threadsafe(renewed_after_failures.set)
        return renewed

    renew_after_failures.__name__ = "job_lease_renew"
    monkeypatch.setattr(services, "job_lease_renew", renew_after_failures)
    host = await host_online(machine_token, "rig")
    request = chat_request(api_key)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], "Hello")
    response = await request
    job_id = response["x-ballast-job-id"]
    before = timezone.now()
    await asyncio.wait_for(renewed_after_failures.wait(), 10)
    assert len(failures) == 5
    job = await Job.objects.aget(id=job_id)
    assert job.lease_until > before + timedelta(seconds=services.JOB_LEASE_S / 2)
    await host.token(offer["job"], " there.")
    await host.done(offer["job"], 2)
    events = sse_events(await read_body(response))
    assert sse_text(events) == "Hello there." and events[-1] == "[DONE]"
    assert (await Job.objects.aget(id=job_id)).status == Job.Status.SUCCEEDED
    await host.close()


def _reap(job_id: str) -> int:
    """The reaper closing the job as if its coroutine had died (its lease run
    out), in one transaction so no renewal lands in between."""
    with transaction.atomic():
        Job.objects.filter(id=job_id).update(
            lease_until=timezone.now() - timedelta(seconds=1)
        )
        return services.attempts_reap()


async def test_a_lost_lease_stops_the_job_and_cancels_the_host(
    catalog, api_key, machine_token, fast_lease
):
    host = await host_online(machine_token, "rig")
    request = chat_request(api_key)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], "Hello")
    response = await request
    job_id = response["x-ballast-job-id"]
    assert await database_sync_to_async(_reap)(job_id) == 1
    body = (await read_body(response)).decode()
    assert "coordinator_lost" in body, body
    cancel = await host.recv_type("cancel")
    assert cancel["job"] == offer["job"], "the host is told to stop"
    job = await Job.objects.aget(id=job_id)
    assert job.status == Job.Status.FAILED and job.error_code == "coordinator_lost"
    attempt = await Attempt.objects.aget(id=offer["job"])
    assert attempt.state == Attempt.State.ENDED
    await host.close()
