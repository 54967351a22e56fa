"""DESIGN.md "No eligible device": 503 at once, or wait first come first served, or 504."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

import jobs.orchestration.run  # noqa: F401
from ballast import local
from jobs import orchestration
from jobs.models import Attempt, Job
from jobs.services import attempts_reap, job_create, job_dispatch

from .helpers import chat_request, host_online

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.mark.parametrize(
    "placement, needle",
    [
        ({"gpu": "H100"}, "placement.gpu='H100'"),
        ({"min_vram_gb": 80}, "placement.min_vram_gb=80"),
        ({"region": "ap-south"}, "placement.region='ap-south'"),
    ],
)
async def test_it_answers_503_at_once_naming_the_unmet_placement(
    catalog, api_key, machine_token, placement, needle
):
    host = await host_online(machine_token, "rig")
    response = await chat_request(api_key, placement=placement)
    assert response.status_code == 503
    body = json.loads(response.content)
    assert needle in body["error"]["message"]
    assert await host.ws.receive_nothing(timeout=0.2)
    await host.close()


async def test_it_answers_503_when_the_model_is_loaded_nowhere_live(catalog, api_key):
    response = await chat_request(api_key)
    assert response.status_code == 503
    assert (
        "not loaded on any live device"
        in json.loads(response.content)["error"]["message"]
    )


async def test_it_answers_404_for_a_model_not_in_the_catalog(catalog, api_key):
    response = await chat_request(api_key, model="gpt-17")
    assert response.status_code == 404
    assert json.loads(response.content)["error"]["param"] == "model"


async def test_it_answers_504_when_no_slot_frees_within_the_wall_clock(
    catalog, api_key, machine_token, settings
):
    settings.BALLAST_QUEUE_TIMEOUT_S = 0.3
    host = await host_online(machine_token, "rig")
    first = chat_request(api_key)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], "busy")
    await first  # streaming: the first request holds the only slot
    response = await chat_request(api_key)
    assert response.status_code == 504
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert job.status == Job.Status.TIMED_OUT
    await host.close()


async def test_a_waiting_request_starts_when_a_slot_frees_without_polling(
    catalog, api_key, machine_token, monkeypatch
):
    """The wake-up is an event: with the fallback poll set to a minute, the waiting
    request still gets its offer as soon as the slot frees."""
    monkeypatch.setattr(orchestration.run, "SLOT_POLL_S", 60.0)
    host = await host_online(machine_token, "rig")
    first = chat_request(api_key, stream=False)
    offer = await host.recv_type("offer")
    second = chat_request(api_key, stream=False, content="second")
    # requests are stored on a pool of database threads: "second" comes first
    # only once it is stored
    await jobs_stored(2)
    third = chat_request(api_key, stream=False, content="third")
    assert await host.ws.receive_nothing(timeout=0.3), "one slot: the others wait"
    await host.answer(offer, ["one"])
    offer2 = await host.recv_type("offer", timeout=5)
    assert offer2["messages"][0]["content"] == "second", "first come, first served"
    await host.answer(offer2, ["two"])
    offer3 = await host.recv_type("offer", timeout=5)
    assert offer3["messages"][0]["content"] == "third"
    await host.answer(offer3, ["three"])
    for request in (first, second, third):
        assert (await request).status_code == 200
    await host.close()


async def test_a_new_device_wakes_waiting_requests(
    catalog, api_key, machine_token, monkeypatch
):
    monkeypatch.setattr(orchestration.run, "SLOT_POLL_S", 60.0)
    busy = await host_online(machine_token, "busy")
    first = chat_request(api_key)
    offer = await busy.recv_type("offer")
    await busy.claim(offer["job"])
    await busy.token(offer["job"], "…")
    await first
    waiting = chat_request(api_key, stream=False)
    fresh = await host_online(machine_token, "fresh")
    offer2 = await fresh.recv_type("offer", timeout=5)
    await fresh.answer(offer2, ["ok"])
    assert (await waiting).status_code == 200
    await busy.close()
    await fresh.close()


async def test_the_reaper_closes_jobs_whose_coordinator_died(
    catalog, renter, live_device
):
    """A job whose owning coroutine stopped renewing its lease is closed, its slot freed."""
    from datetime import timedelta

    from django.utils import timezone

    device = await database_sync_to_async(live_device)()
    job = await database_sync_to_async(job_create)(
        renter=renter,
        api_key=None,
        model=catalog,
        endpoint="chat",
        messages=[{"role": "user", "content": "x"}],
        prompt=None,
        params={"max_tokens": 4},
        placement={},
        stream=False,
    )
    dispatch = await database_sync_to_async(job_dispatch)(job=job)
    await device.arefresh_from_db()
    assert device.slots_used == 1
    assert await database_sync_to_async(attempts_reap)() == 0, (
        "a live lease is left alone"
    )
    await Job.objects.filter(id=job.id).aupdate(
        lease_until=timezone.now() - timedelta(seconds=1)
    )
    assert await database_sync_to_async(attempts_reap)() == 1
    await device.arefresh_from_db()
    attempt = await Attempt.objects.aget(id=dispatch.attempt.id)
    job = await Job.objects.aget(id=job.id)
    assert device.slots_used == 0
    assert attempt.outcome == "cancelled" and job.status == Job.Status.FAILED
    assert job.error_code == "coordinator_lost"


async def jobs_stored(count: int, timeout: float = 5.0) -> None:
    """Wait until ``count`` jobs are stored (a state, not a sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while await Job.objects.acount() < count:
        assert loop.time() < deadline, f"{count} jobs were never stored"
        await asyncio.sleep(0.01)


async def test_a_failed_re_dispatch_is_tried_once_more(
    catalog, api_key, machine_token, monkeypatch
):
    """A queued request's look-up for a slot that fails on a dead connection is
    retried (another connection), not answered 503 at once."""
    from django.db import OperationalError

    monkeypatch.setattr(orchestration.run, "SLOT_POLL_S", 60.0)
    host = await host_online(machine_token, "rig")
    first = chat_request(api_key, stream=False)
    offer = await host.recv_type("offer")
    real = orchestration.run.services.job_dispatch
    failures = []

    def flaky(**kwargs):  # the job coroutine's look-ups (not the request step's)
        if "continue_from" in kwargs and not failures:
            failures.append(kwargs["job"].id)
            raise OperationalError("server closed the connection unexpectedly")
        return real(**kwargs)

    monkeypatch.setattr(orchestration.run.services, "job_dispatch", flaky)
    second = chat_request(api_key, stream=False, content="second")
    await jobs_stored(2)
    await host.answer(offer, ["one"])
    offer2 = await host.recv_type("offer", timeout=5)
    assert offer2["messages"][0]["content"] == "second"
    await host.answer(offer2, ["two"])
    assert (await first).status_code == 200
    assert (await second).status_code == 200 and failures
    await host.close()


async def test_a_request_failing_on_the_database_fails_its_job_not_cancels_it(
    catalog, api_key, machine_token, monkeypatch
):
    """The coordinator's own failure (the database, twice) answers 503 and the job
    is failed naming it: not recorded as the renter going away."""
    from django.db import OperationalError

    monkeypatch.setattr(orchestration.run, "SLOT_POLL_S", 60.0)
    host = await host_online(machine_token, "rig")
    first = chat_request(api_key, stream=False)
    offer = await host.recv_type("offer")

    real = orchestration.run.services.job_dispatch

    def down(**kwargs):  # the job coroutine's look-ups (not the request step's)
        if "continue_from" in kwargs:
            raise OperationalError("the database is gone")
        return real(**kwargs)

    monkeypatch.setattr(orchestration.run.services, "job_dispatch", down)
    second = await chat_request(api_key, stream=False, content="second")
    assert second.status_code == 503
    failed = await Job.objects.aget(status=Job.Status.FAILED)
    assert failed.error_code == "database_unavailable"
    assert "the database is gone" in failed.error_message
    await host.answer(offer, ["one"])
    assert (await first).status_code == 200
    await host.close()


async def test_a_queued_job_that_gets_a_slot_wakes_the_next_one(
    catalog, api_key, machine_token, monkeypatch
):
    """Slots that free together wake the same oldest waiters: each queued job that
    gets a slot wakes the next ones, so every free slot fills without the
    fallback poll (set to a minute here). Three jobs wait behind a busy slot;
    the device gains three slots and only the oldest is woken: all three start."""
    from hosts.models import Device
    from jobs.services import jobs_waiting_channels

    monkeypatch.setattr(orchestration.run, "SLOT_POLL_S", 60.0)
    host = await host_online(machine_token, "rig")
    first = chat_request(api_key, stream=False)
    offer = await host.recv_type("offer")
    waiting = [
        chat_request(api_key, stream=False, content=f"queued {i}") for i in range(3)
    ]
    await jobs_stored(4)
    assert await host.ws.receive_nothing(timeout=0.2), "one slot: the others wait"
    await Device.objects.filter(machine=host.machine).aupdate(slots_total=4)
    oldest = await database_sync_to_async(jobs_waiting_channels)(
        model_id=catalog.id, limit=1
    )
    for channel in oldest:
        await local.channel_send(get_channel_layer(), channel, {"type": "slot.free"})
    offers = [await host.recv_type("offer", timeout=5) for _ in range(3)]
    assert sorted(o["messages"][0]["content"] for o in offers) == [
        "queued 0",
        "queued 1",
        "queued 2",
    ]
    for started in (offer, *offers):
        await host.answer(started, ["ok"])
    for request in (first, *waiting):
        assert (await request).status_code == 200
    await host.close()
