"""DESIGN.md "Picking a device", the ranking: score, then the device's median first-token
time for the model (unknown last), then a random tie-break — kept on the device-model
row (score copy, tie-break key) so that one index serves the pick."""

from __future__ import annotations

from collections import Counter

import pytest
from django.utils import timezone

from catalog.models import CatalogModel
from hosts.models import Device, DeviceModel
from hosts.services import device_outcome_record, device_score_recompute
from jobs.models import Job
from jobs.services import device_claim, job_dispatch
from tests.conftest import REFERENCE_MODEL
from tests.jobs.helpers import job_queued

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(catalog, renter):
    def make() -> Job:
        return job_queued(renter, catalog)

    return make


def copies(device: Device) -> set[int]:
    return set(
        DeviceModel.objects.filter(device=device).values_list("score", flat=True)
    )


def test_it_keeps_the_score_copy_in_sync_wherever_the_score_is_written(live_device):
    """Every device-model row of a device carries the device's score: at creation,
    after the score services, after a bulk update and after a save (the admin)."""
    CatalogModel.objects.create(**{**REFERENCE_MODEL, "id": "other-model"})
    device = live_device(models=("smollm2-135m-instruct", "other-model"))
    assert DeviceModel.objects.filter(device=device).count() == 2
    assert copies(device) == {Device.objects.get(id=device.id).score}

    Device.objects.filter(id=device.id).update(score=17)
    assert copies(device) == {17}

    device.refresh_from_db()
    device.score = 83
    device.save()
    assert copies(device) == {83}

    for _ in range(3):  # failures pull the score down through the real service
        device_outcome_record(device_id=device.id, success=False)
    device.refresh_from_db()
    assert device.score != 83
    assert copies(device) == {device.score}
    assert device_score_recompute(device_id=device.id) == device.score
    assert copies(device) == {device.score}

    Device.objects.filter(id=device.id).update(score=41)
    late = DeviceModel.objects.create(device=device, model_id="late-model", loaded=True)
    late.refresh_from_db()
    assert late.score == 41, "a row made later copies the device's current score"


def test_it_claims_in_ranking_order_with_unknown_first_token_time_last(
    live_device, job
):
    slow = live_device("slow")
    fast = live_device("fast")
    unknown = live_device("unknown")
    best = live_device("best")
    worst = live_device("worst")
    Device.objects.filter(id__in=[slow.id, fast.id, unknown.id]).update(score=70)
    Device.objects.filter(id=best.id).update(score=90)
    Device.objects.filter(id=worst.id).update(score=40)
    DeviceModel.objects.filter(device__in=[slow, worst]).update(ttft_ms_recent=900)
    DeviceModel.objects.filter(device__in=[fast, best]).update(ttft_ms_recent=100)
    DeviceModel.objects.filter(device=worst).update(ttft_ms_recent=5)
    claimed = []
    for _ in range(5):  # one slot each: every claim takes the next in the ranking
        dispatch = job_dispatch(job=job())
        claimed.append(dispatch.attempt.device_id)
    assert claimed == [best.id, fast.id, slow.id, unknown.id, worst.id]
    assert job_dispatch(job=job()).wait


def claims_among(devices, *, job, catalog, times: int) -> list[int]:
    """Claim ``times`` slots, giving each back at once; the claimed device ids."""
    picked = []
    the_job = job()
    for _ in range(times):
        device = device_claim(job=the_job, model=catalog, now=timezone.now())
        picked.append(device.id)
        Device.objects.filter(id=device.id).update(slots_used=0)
    assert set(picked) <= {d.id for d in devices}
    return picked


def test_it_breaks_ties_at_random(live_device, job, catalog):
    """Two devices equal in score and first-token time: each claim takes either
    with the same chance, whatever came before (not one device, not alternation)."""
    one, two = live_device("one"), live_device("two")
    Device.objects.filter(id__in=[one.id, two.id]).update(score=75)
    picked = claims_among([one, two], job=job, catalog=catalog, times=300)
    counts = Counter(picked)
    # expected 150 each (sd 8.7): 100 is more than 5 sd away
    assert counts[one.id] > 100 and counts[two.id] > 100, counts
    repeats = sum(1 for a, b in zip(picked, picked[1:], strict=False) if a == b)
    # the same device twice in a row half of the time (expected 149.5, sd 8.6)
    assert 100 < repeats < 200, repeats


def test_a_device_joining_a_tie_does_not_take_every_claim(live_device, job, catalog):
    """A device entering a tie group (new, or its score changed) starts level with
    the group, not behind the keys the others accumulated over their claims."""
    one, two, late = live_device("one"), live_device("two"), live_device("late")
    Device.objects.filter(id__in=[one.id, two.id]).update(score=75)
    Device.objects.filter(id=late.id).update(score=10)
    claims_among([one, two], job=job, catalog=catalog, times=200)
    Device.objects.filter(id=late.id).update(score=75)  # joins the tie
    counts = Counter(claims_among([one, two, late], job=job, catalog=catalog, times=90))
    # expected 30 each (sd 4.5); a key left at its old value would take ~100 in a row
    assert 10 < counts[late.id] < 60, counts
    assert counts[one.id] > 10 and counts[two.id] > 10, counts
