"""DESIGN.md "Picking a device": every eligibility rule, the ranking, the 503 reasons."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from hosts.models import Device, DeviceModel, Machine
from jobs.models import Attempt, Job, Verification
from jobs.selectors import devices_eligible, placement_filter, requirement_unmet
from jobs.services import job_dispatch
from tests.devices import device_measured
from tests.jobs.helpers import job_queued

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(catalog, renter):
    def make(placement=None) -> Job:
        return job_queued(renter, catalog, placement=placement)

    return make


def eligible(job, catalog):
    return list(devices_eligible(job=job, model=catalog, now=timezone.now()))


def test_it_accepts_a_live_idle_device(live_device, job, catalog):
    device = live_device()
    assert eligible(job(), catalog) == [device]


def test_it_refuses_a_heartbeat_older_than_the_max_age(
    live_device, job, catalog, settings
):
    device = live_device()
    age = timedelta(seconds=settings.BALLAST_HEARTBEAT_MAX_AGE_S)
    Machine.objects.filter(id=device.machine_id).update(
        last_heartbeat_at=timezone.now() - age
    )
    assert eligible(job(), catalog) == []
    Machine.objects.filter(id=device.machine_id).update(
        last_heartbeat_at=timezone.now() - age + timedelta(seconds=2)
    )
    assert eligible(job(), catalog) == [device]


def test_it_refuses_a_closed_connection_at_once(live_device, job, catalog):
    device = live_device()
    Machine.objects.filter(id=device.machine_id).update(connected=False)
    assert eligible(job(), catalog) == []


@pytest.mark.parametrize(
    "change",
    [
        lambda d: Device.objects.filter(id=d.id).update(paused=True),
        lambda d: Device.objects.filter(id=d.id).update(quarantined=True),
        lambda d: Machine.objects.filter(id=d.machine_id).update(paused=True),
        lambda d: Machine.objects.filter(id=d.machine_id).update(host_paused=True),
    ],
    ids=["device paused", "quarantined", "owner paused", "agent paused"],
)
def test_it_refuses_paused_or_quarantined_devices(live_device, job, catalog, change):
    device = live_device()
    change(device)
    assert eligible(job(), catalog) == []


def test_it_needs_the_model_loaded(live_device, job, catalog):
    live_device(models=["other-model"])
    assert eligible(job(), catalog) == []
    assert "not loaded on any live device" in requirement_unmet(
        model=catalog, placement={}, now=timezone.now()
    )


def test_it_counts_slots_from_its_own_claims(live_device, job, catalog):
    device = live_device(slots=2)
    Device.objects.filter(id=device.id).update(slots_used=2)
    assert eligible(job(), catalog) == []
    Device.objects.filter(id=device.id).update(slots_used=1)
    assert eligible(job(), catalog) == [device]


def test_it_refuses_a_gpu_at_or_over_88_c(live_device, job, catalog):
    live_device("hot", temp_c=88.0)
    cool = live_device("cool", temp_c=87.9)
    cpu = live_device("cpu", temp_c=None)
    assert {d.id for d in eligible(job(), catalog)} == {cool.id, cpu.id}


def test_it_needs_free_vram_for_the_request(live_device, job, catalog):
    live_device("tight", vram_free_mb=catalog.vram_per_request_mb - 1)
    roomy = live_device("roomy", vram_free_mb=catalog.vram_per_request_mb)
    assert eligible(job(), catalog) == [roomy]


def test_it_skips_machines_that_refuse_serverless(live_device, job, catalog):
    live_device(accepts_serverless=False)
    assert eligible(job(), catalog) == []


@pytest.mark.parametrize(
    "placement, fits",
    [
        ({"gpu": "RTX 4090"}, True),
        ({"gpu": "RTX 3090"}, False),
        ({"gpu": "%"}, False),  # LIKE's wildcards match only themselves
        ({"gpu": "RTX_4090"}, False),
        ({"gpu": "\\"}, False),
        ({"min_vram_gb": 24}, True),
        ({"min_vram_gb": 25}, False),
        ({"region": "eu"}, True),
        ({"region": "us"}, False),
    ],
)
def test_it_honours_placement(live_device, job, catalog, placement, fits):
    """A declared RTX 4090 measured at a 4090's speed (``placement.gpu`` and
    ``min_vram_gb`` go by what was measured: the tests below)."""
    device = live_device(region="eu", vram_total_mb=24576)
    device_measured(device, tokens_per_s=400)
    assert eligible(job(placement), catalog) == ([device] if fits else [])
    unmet = requirement_unmet(model=catalog, placement=placement, now=timezone.now())
    if fits:
        assert unmet is None
    else:
        field = next(iter(placement))
        assert f"placement.{field}" in unmet


def test_it_never_offers_a_job_twice_to_one_device(live_device, job, catalog):
    device = live_device(slots=4)
    the_job = job()
    dispatch = job_dispatch(job=the_job)
    assert dispatch.attempt.device_id == device.id
    assert eligible(the_job, catalog) == []
    again = job_dispatch(job=the_job)
    assert again.attempt is None and again.exhausted, "no other device: 502, not a wait"


def test_it_ranks_by_score_then_first_token_time(live_device, job, catalog):
    slow = live_device("slow")
    fast = live_device("fast")
    unknown = live_device("unknown")
    best = live_device("best")
    Device.objects.filter(id__in=[slow.id, fast.id, unknown.id]).update(score=70)
    Device.objects.filter(id=best.id).update(score=90)
    DeviceModel.objects.filter(device=slow).update(ttft_ms_recent=900)
    DeviceModel.objects.filter(device=fast).update(ttft_ms_recent=100)
    assert [d.id for d in eligible(job(), catalog)] == [
        best.id,
        fast.id,
        slow.id,
        unknown.id,
    ]


def test_it_claims_a_slot_and_writes_the_attempt_with_its_deadline(
    live_device, job, catalog, settings
):
    device = live_device()
    the_job = job()
    before = timezone.now()
    dispatch = job_dispatch(job=the_job)
    attempt = dispatch.attempt
    device.refresh_from_db()
    assert device.slots_used == 1
    assert attempt.state == Attempt.State.OFFERED and attempt.kind == Attempt.Kind.FRESH
    assert attempt.claim_deadline >= before + timedelta(
        seconds=settings.BALLAST_CLAIM_TIMEOUT_S
    )
    assert dispatch.offer["job"] == str(attempt.id)
    assert dispatch.machine_channel == device.machine.channel_name
    other = job()
    assert job_dispatch(job=other).wait


def test_it_serves_queued_jobs_first_come_first_served(live_device, job, catalog):
    device = live_device()
    Device.objects.filter(id=device.id).update(slots_used=1)
    older, younger = job(), job()
    assert job_dispatch(job=older).wait
    Device.objects.filter(id=device.id).update(slots_used=0)
    assert job_dispatch(job=younger).wait, "the younger job must not jump the queue"
    assert job_dispatch(job=older).attempt is not None


def test_a_spot_check_never_waits_behind_queued_renter_jobs(live_device, job, catalog):
    """A queued renter job that cannot use a quarantined device must not hold back
    the spot check that targets it (found as a flaky CI run)."""
    device = live_device()
    Device.objects.filter(id=device.id).update(quarantined=True)
    assert job_dispatch(job=job()).wait  # a renter job, queued
    check = job()
    Job.objects.filter(id=check.id).update(is_spot_check=True, target_device=device)
    check.refresh_from_db()
    dispatch = job_dispatch(job=check)
    assert dispatch.attempt is not None and dispatch.attempt.device_id == device.id


def test_a_device_scoring_a_verification_is_offered_no_job(
    live_device, job, catalog, renter
):
    """A verifier's engine is busy while it scores (minutes for a long
    answer): a job offered then missed its first-token deadline, an honest
    host's failure (fresh-eyes review 3). Until its scores arrive it takes
    none; a verification sent before its machine's current connection (the
    agent restarted: lost) holds nothing."""
    device = live_device()
    now = timezone.now()
    Machine.objects.filter(id=device.machine_id).update(connected_at=now)
    ver = Verification.objects.create(
        job=job_queued(renter, catalog), device=device, verifier=device,
        status="offered", offered_at=now, sent_at=now,
    )  # fmt: skip
    assert eligible(job(), catalog) == []
    Verification.objects.filter(id=ver.id).update(status="scored")
    assert eligible(job(), catalog) == [device]
    Verification.objects.filter(id=ver.id).update(status="offered")
    Machine.objects.filter(id=device.machine_id).update(
        connected_at=now + timedelta(seconds=1)
    )
    assert eligible(job(), catalog) == [device]


@pytest.mark.parametrize("seed", range(16))
def test_the_query_and_the_one_row_rule_agree(seed, live_device, renter, catalog):
    """``jobs.selectors.devices_eligible`` (one query) and
    ``Device.is_eligible_for`` (one row) pick the same devices, over fleets of
    random devices (each rule's field varied, a verification open on some)
    and jobs (placement, spot check,
    rental, devices already tried, what the output needs of the engine, kinds
    and measured speeds under ``placement.gpu``/``min_vram_gb``); and the Q of
    ``placement_filter`` (the 503's) places the same devices as the row's
    ``Device.placement_meets``."""
    import random

    from jobs.models import Rental

    rng = random.Random(seed)
    now = timezone.now()
    devices = []

    def sometimes(bad, good, p=0.12):
        """Mostly ``good``: each rule alone decides often enough to be tested."""
        return rng.choice(bad) if rng.random() < p else good

    for i in range(12):
        device = live_device(
            f"rig-{seed}-{i}",
            slots=rng.choice([1, 2]),
            temp_c=sometimes([88.0, 95.0], rng.choice([None, 50.0, 87.9])),
            vram_free_mb=sometimes(
                [catalog.vram_per_request_mb - 1],
                rng.choice([catalog.vram_per_request_mb, 8000]),
            ),
            models=sometimes([("other-model",)], (catalog.id,)),
            vram_total_mb=rng.choice([8192, 24576, 81920]),
            gpu=rng.choice(
                [
                    "NVIDIA GeForce RTX 4090",
                    "AMD Radeon 7900",
                    "RTX_3090",
                    "AMD EPYC 7763 64-Core Processor",
                ]
            ),
            kind=sometimes(["cpu"], "gpu", p=0.2),
            region=rng.choice(["", "eu", "EU", "us-east"]),
            accepts_serverless=sometimes([False], True),
            paused=sometimes([True], False),
            features=rng.choice(
                [(), ("logprobs",), ("json_schema",), ("json_object", "logprobs")]
                + [("json_object", "json_schema", "logprobs")] * 2
            ),
        )
        Device.objects.filter(id=device.id).update(
            slots_used=sometimes([device.slots_total], 0),
            quarantined=sometimes([True], False),
        )
        speed = rng.choice([None, 60.0, 220.0, 400.0])  # not measured, CPU, …
        if speed is not None:
            device_measured(device, tokens_per_s=speed)
        if rng.random() < 0.1:  # placed under a name it no longer declares
            DeviceModel.objects.filter(device=device).update(
                placed_name="NVIDIA H100", placed_vram_mb=81920
            )
        machine = Machine.objects.filter(id=device.machine_id)
        machine.update(connected_at=now - timedelta(hours=1))
        if rng.random() < 0.12:
            machine.update(connected=False)
        if rng.random() < 0.12:
            machine.update(
                last_heartbeat_at=now - timedelta(minutes=5), lease=None, stale=True
            )
        if rng.random() < 0.12:
            machine.update(host_paused=True)
        if rng.random() < 0.12:
            machine.update(paused=True)
        if rng.random() < 0.12:
            machine.update(agent_accepts_serverless=False)
        if rng.random() < 0.12:  # verifying: sent now, before, or answered
            sent, status = rng.choice(
                [(now, "offered"), (now - timedelta(days=1), "offered"), (now, "scored")]
            )
            Verification.objects.create(
                job=job_queued(renter, catalog), device=device, verifier=device,
                status=status, offered_at=sent, sent_at=sent,
            )  # fmt: skip
        if rng.random() < 0.25:
            Rental.objects.create(
                renter=renter,
                device=device,
                hours=1,
                price_per_hour_nano=1,
                status=rng.choice([Rental.Status.PENDING, Rental.Status.ENDED]),
            )
        devices.append(device)
    placement = rng.choice(
        [
            {},
            {"gpu": "rtx"},
            {"gpu": "RTX_"},
            {"gpu": "4090"},
            {"gpu": "EPYC"},
            {"min_vram_gb": 16},
            {"min_vram_gb": 30},
            {"gpu": "rtx", "min_vram_gb": 24},
            {"region": "eu"},
        ]
    )
    the_job = job_queued(renter, catalog, placement=placement)
    the_job.params = {
        "max_tokens": 8,
        **rng.choice(
            [
                {},
                {"logprobs": 2},
                {"response_format": '{"type":"json_object"}'},
                {"response_format": '{"type":"json_schema"}', "logprobs": 0},
            ]
        ),
    }
    Job.objects.filter(id=the_job.id).update(params=the_job.params)
    if rng.random() < 0.3:  # a spot check on one device
        the_job.is_spot_check = True
        the_job.target_device_id = rng.choice(devices).id
        Job.objects.filter(id=the_job.id).update(
            is_spot_check=True, target_device_id=the_job.target_device_id
        )
    before = [d for d in devices_eligible(job=the_job, model=catalog, now=now)]
    for tried in [*before[:1], rng.choice(devices)]:  # one that was eligible
        Attempt.objects.get_or_create(
            job=the_job,
            device=tried,
            defaults={"claim_deadline": now, "state": "ended"},
        )
    by_query = {d.id for d in devices_eligible(job=the_job, model=catalog, now=now)}
    by_row, placed_by_row = set(), set()
    for device in Device.objects.select_related("machine__lease"):
        loaded = DeviceModel.objects.filter(
            device=device, model_id=catalog.id, loaded=True
        ).exists()
        rented = Rental.objects.filter(
            device=device, status__in=Rental.OPEN_STATUSES
        ).exists()
        tried = Attempt.objects.filter(job=the_job, device=device).exists()
        row = DeviceModel.objects.filter(device=device, model_id=catalog.id).first()
        placed = (row.placed_name, row.placed_vram_mb) if row else ("", 0)
        verifying = Verification.objects.filter(
            verifier=device, status="offered", sent_at__gte=device.machine.connected_at
        ).exists()  # (every machine here has connected_at)
        if device.is_eligible_for(
            the_job,
            vram_per_request_mb=catalog.vram_per_request_mb,
            now=now,
            loaded=loaded,
            rented=rented,
            tried=tried,
            placed=placed,
            verifying=verifying,
        ):
            by_row.add(device.id)
        if device.placement_meets(placement, placed=placed):
            placed_by_row.add(device.id)
    assert by_query == by_row
    measured = {k: v for k, v in placement.items() if k in ("gpu", "min_vram_gb")}
    placed_by_q = set(
        Device.objects.filter(
            placement_filter(measured, model_id=catalog.id)
        ).values_list("id", flat=True)
    )
    assert placed_by_q == placed_by_row, "the Q behind the 503 is the same rule"
    assert len(by_query) < len(before) or not before
