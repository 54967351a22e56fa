"""DESIGN.md "Picking a device": a device runs the catalog entry's pinned
weights or gets no work of that model (the heartbeat's ``weights``,
docs/protocol-notes.md 2026-12-07). The query (``devices_eligible``, raw SQL),
its Q twin (``devices_untried_exist``, ``requirement_unmet``) and the one-row
rule (``Device.is_eligible_for``) agree; on SQLite and on PostgreSQL (CI)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from hosts.models import Device, DeviceModel
from hosts.services import machine_heartbeat
from jobs.selectors import devices_eligible, devices_untried_exist, requirement_unmet
from jobs.services import job_dispatch
from tests.jobs.helpers import job_queued

pytestmark = pytest.mark.django_db

PINNED = "0123456789abcdef" * 4
OTHER = "fedcba9876543210" * 4


@pytest.fixture
def pinned(catalog):
    """The reference entry pinning ``PINNED``, a Q4_1 file."""
    catalog.weights_sha256, catalog.quantization = PINNED, "Q4_1"
    catalog.save(update_fields=["weights_sha256", "quantization"])
    return catalog


def declare(device: Device, weights: dict | None) -> Device:
    """A heartbeat of ``device``'s machine listing the reference model loaded,
    declaring ``weights`` (``{"sha256", "quantization"}``; None: an agent of
    before 2026-12-07, which sends no ``weights``)."""
    report = {
        "index": device.index,
        "temp_c": 50.0,
        "vram_free_mb": 8000,
        "slots": 1,
        "loaded_models": ["smollm2-135m-instruct"],
    }
    if weights is not None:
        report["weights"] = {"smollm2-135m-instruct": weights}
    machine_heartbeat(
        machine_id=str(device.machine_id),
        heartbeat={"paused": False, "devices": [report]},
    )
    return device


def by_row(job, model) -> set[int]:
    """The devices ``Device.is_eligible_for`` accepts for ``job``."""
    now = timezone.now()
    accepted = set()
    for device in Device.objects.select_related("machine__lease"):
        row = DeviceModel.objects.filter(device=device, model_id=model.id).first()
        if device.is_eligible_for(
            job,
            vram_per_request_mb=model.vram_per_request_mb,
            now=now,
            loaded=bool(row and row.loaded),
            rented=False,
            tried=False,
            pinned=model,
            weights=row.weights_sha256 if row else "",
        ):
            accepted.add(device.id)
    return accepted


def test_it_offers_a_pinned_model_only_to_devices_running_its_weights(
    live_device, pinned, renter
):
    right = declare(live_device("right"), {"sha256": PINNED, "quantization": "Q4_1"})
    declare(live_device("requantized"), {"sha256": OTHER, "quantization": "Q8_0"})
    declare(live_device("old-agent"), None)
    job = job_queued(renter, pinned)
    now = timezone.now()
    assert [d.id for d in devices_eligible(job=job, model=pinned, now=now)] == [
        right.id
    ]
    assert by_row(job, pinned) == {right.id}
    dispatch = job_dispatch(job=job)
    assert dispatch.attempt is not None and dispatch.attempt.device_id == right.id


def test_it_answers_503_when_no_live_device_runs_the_weights(
    live_device, pinned, renter
):
    declare(live_device("requantized"), {"sha256": OTHER, "quantization": "Q8_0"})
    job = job_queued(renter, pinned)
    now = timezone.now()
    assert devices_eligible(job=job, model=pinned, now=now) == []
    assert by_row(job, pinned) == set()
    assert not devices_untried_exist(job=job, model=pinned, now=now)
    why = requirement_unmet(model=pinned, placement={}, now=now)
    assert why == (
        "no live device runs the catalog's weights of model 'smollm2-135m-instruct'"
        " (Q4_1 0123456789ab…)"
    )


def test_a_device_that_loads_the_right_file_becomes_eligible(
    live_device, pinned, renter
):
    device = declare(live_device(), {"sha256": OTHER, "quantization": "Q8_0"})
    job = job_queued(renter, pinned)
    assert devices_eligible(job=job, model=pinned, now=timezone.now()) == []
    declare(device, {"sha256": PINNED, "quantization": "Q4_1"})
    assert devices_eligible(job=job, model=pinned, now=timezone.now()) == [device]
    assert by_row(job, pinned) == {device.id}


def test_an_entry_that_pins_nothing_takes_any_weights(live_device, catalog, renter):
    """An entry without a digest (made by hand, not from its file) pins
    nothing: every device listing the model is eligible, declared or not."""
    devices = {
        declare(live_device("a"), {"sha256": OTHER, "quantization": "Q8_0"}).id,
        declare(live_device("b"), None).id,
    }
    job = job_queued(renter, catalog)
    found = {d.id for d in devices_eligible(job=job, model=catalog, now=timezone.now())}
    assert found == devices == by_row(job, catalog)
