"""``placement.gpu`` and ``min_vram_gb`` go by what Ballast measured of a device,
never by what its host declared alone (docs/design-notes.md "Placement by what
was measured"; issue 32 item 4): the dispatch's query, the one-row rule, the
503's reasons and what renters see of rentable devices."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.utils import timezone

from hosts.models import Device, DeviceModel
from jobs.selectors import devices_eligible, requirement_unmet
from tests.devices import MODEL, device_measured
from tests.jobs.helpers import job_queued

pytestmark = pytest.mark.django_db

GPU = {"gpu": "RTX 4090"}
VRAM = {"min_vram_gb": 24}


def eligible(renter, catalog, placement=None) -> list:
    job = job_queued(renter, catalog, placement=placement)
    return list(devices_eligible(job=job, model=catalog, now=timezone.now()))


def unmet(catalog, placement) -> str | None:
    return requirement_unmet(model=catalog, placement=placement, now=timezone.now())


def test_a_device_not_measured_yet_takes_only_unplaced_work(
    live_device, renter, catalog
):
    """A new device declaring an RTX 4090 is not placed as one: requests
    asking a 4090 or 24 GB are a 503 saying why; every other request runs on
    it (which is how it gets measured)."""
    device = live_device()
    for placement in (GPU, VRAM):
        assert eligible(renter, catalog, placement) == []
        reason = unmet(catalog, placement)
        assert f"placement.{next(iter(placement))}" in reason
        assert "not measured yet" in reason and "RTX 4090" in reason
    assert eligible(renter, catalog) == [device]


def test_a_declared_4090_measured_like_a_cpu_is_not_placed_as_one(
    live_device, renter, catalog
):
    device = live_device()
    assert device_measured(device, tokens_per_s=60, jobs=2) is None, "too few"
    assert eligible(renter, catalog, GPU) == []
    assert device_measured(device, tokens_per_s=60, jobs=1) == pytest.approx(60)
    assert eligible(renter, catalog, GPU) == []
    reason = unmet(catalog, GPU)
    assert "measured 60 tokens/s" in reason and "below the 250 tokens/s" in reason
    assert eligible(renter, catalog) == [device], "unplaced work still runs"
    row = DeviceModel.objects.get(device=device)
    assert (row.placed_name, row.placed_vram_mb) == ("", 0)
    assert "a CPU's speed" in row.measured_like


def test_a_gpu_measured_at_its_class_speed_is_placed(live_device, renter, catalog):
    """The median of its latest measured jobs decides: a few slow jobs (a long
    prompt, a slow network) do not unplace a fast device, nor a few fast ones
    place a slow one."""
    device = live_device()
    device_measured(device, tokens_per_s=400, jobs=3)
    assert eligible(renter, catalog, GPU) == [device]
    assert eligible(renter, catalog, VRAM) == [device]
    assert unmet(catalog, GPU) is None
    device_measured(device, tokens_per_s=60, jobs=2)
    assert eligible(renter, catalog, GPU) == [device], "median 400 of 5"
    device_measured(device, tokens_per_s=60, jobs=2)
    assert eligible(renter, catalog, GPU) == [], "median 60 of 7"


def test_a_device_is_credited_no_more_vram_than_its_class_has(
    live_device, renter, catalog
):
    """A fast "RTX 4090" declaring 80 GB is placed with 24 GB: a 4090 has no
    more."""
    device = live_device(vram_total_mb=81920)
    device_measured(device, tokens_per_s=400)
    assert eligible(renter, catalog, {"min_vram_gb": 24}) == [device]
    assert eligible(renter, catalog, {"min_vram_gb": 40}) == []
    reason = unmet(catalog, {"min_vram_gb": 40})
    assert "placement.min_vram_gb=40" in reason
    assert "credited at most 24576 MiB" in reason


def test_a_cpu_is_never_placed_by_gpu_or_vram(live_device, renter, catalog):
    device = live_device(
        gpu="AMD EPYC 7763 64-Core Processor", kind="cpu", vram_total_mb=24576
    )
    device_measured(device, tokens_per_s=400)
    assert eligible(renter, catalog, {"gpu": "EPYC"}) == []
    assert eligible(renter, catalog, VRAM) == []
    assert "a CPU is never placed by gpu or VRAM" in unmet(catalog, VRAM)
    assert eligible(renter, catalog) == [device]


def test_a_name_ballast_does_not_know_is_not_placed(live_device, renter, catalog):
    device = live_device(gpu="Hyper GPU 9000")
    device_measured(device, tokens_per_s=400)
    assert eligible(renter, catalog, {"gpu": "Hyper"}) == []
    assert "not a GPU class Ballast knows" in unmet(catalog, {"gpu": "Hyper"})


def test_a_placed_device_is_chosen_over_an_unplaced_better_scored_one(
    live_device, renter, catalog
):
    """Placement filters before the ranking: a declared 4090 with a better
    score but measured slow never takes a job asking a 4090."""
    slow = live_device("slow")
    fast = live_device("fast")
    device_measured(slow, tokens_per_s=60)
    device_measured(fast, tokens_per_s=400)
    Device.objects.filter(id=slow.id).update(score=95)
    assert eligible(renter, catalog, GPU) == [fast]
    assert [d.id for d in eligible(renter, catalog)] == [slow.id, fast.id]


def test_a_renter_sees_each_rentable_device_as_what_it_measured(
    api_key, live_device
):
    """``/v1/devices`` lists the host's declaration beside Ballast's
    measurement: a declared RTX 4090 measured like a CPU is placed as
    nothing; a CPU says it is one."""
    cheat = live_device("cheat")
    honest = live_device("box", gpu="AMD EPYC 7763", kind="cpu")
    fast = live_device("fast")
    device_measured(cheat, tokens_per_s=60)
    device_measured(fast, tokens_per_s=400, jobs=4)
    client = Client(headers={"authorization": f"Bearer {api_key}"})
    listed = {
        d["id"]: d for d in json.loads(client.get("/v1/devices").content)["data"]
    }
    assert listed[cheat.id]["name"] == "NVIDIA GeForce RTX 4090"
    assert listed[cheat.id]["kind"] == "gpu"
    assert listed[cheat.id]["measured"] == {
        MODEL: {
            "tokens_per_s": pytest.approx(60),
            "jobs": 3,
            "like": "slower than every GPU class (a CPU's speed)",
            "placed_as": None,
        }
    }
    assert listed[honest.id]["kind"] == "cpu" and listed[honest.id]["measured"] == {}
    assert listed[fast.id]["measured"][MODEL]["placed_as"] == "RTX 4090"
    assert listed[fast.id]["measured"][MODEL]["jobs"] == 4
