"""DESIGN.md "Reliability score": the formula, its worked values, and its inputs."""

from __future__ import annotations

import statistics
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from hosts.models import Device, DeviceModel, DeviceOutcome, Machine, OnlineSpan
from hosts.scoring import score_parts, score_round, score_unrounded
from hosts.services import (
    device_online_fraction,
    device_outcome_record,
    device_score_inputs,
    device_score_recompute,
    online_span_extend,
)
from tests.vectors import vectors

CASES = vectors("score")["cases"]
MODEL = "smollm2-135m-instruct"


@pytest.mark.parametrize("case", CASES, ids=[c["note"] for c in CASES])
def test_it_reproduces_every_worked_score(case):
    value = score_unrounded(
        outcomes=case["outcomes"],
        successes=case["successes"],
        online_fraction=case["online_fraction"],
        model_median_ttft_ms=case["model_median_ttft_ms"],
        device_ttft_ms=case["device_ttft_ms"],
    )
    if case["unrounded"] is not None:
        assert value == Decimal(case["unrounded"])
    assert score_round(value) == case["expected_score"]


def test_its_parts_are_70_20_and_10():
    assert score_parts(
        outcomes=4,
        successes=3,
        online_fraction=Decimal("0.5"),
        model_median_ttft_ms=100,
        device_ttft_ms=400,
    ) == (Decimal("52.5"), Decimal("10.0"), Decimal("2.50"))
    assert score_parts(
        outcomes=0,
        successes=0,
        online_fraction=1,
        model_median_ttft_ms=100,
        device_ttft_ms=None,
    ) == (0, 20, 10), "no first-token time for the device: the part counts as 1"


def test_it_rounds_half_up():
    assert score_round(Decimal("48.5")) == 49
    assert score_round(Decimal("48.4999")) == 48


@pytest.mark.django_db
def test_it_counts_online_time_from_spans_with_gaps_over_30_s(live_device, settings):
    device = live_device()
    now = timezone.now()
    Device.objects.filter(id=device.id).update(first_seen_at=now - timedelta(hours=48))
    OnlineSpan.objects.filter(machine_id=device.machine_id).delete()
    # heartbeats every 10 s for 6 h, then silence: a quarter of the last 24 h online
    start = now - timedelta(hours=6)
    t = start
    while t <= now:
        online_span_extend(machine_id=str(device.machine_id), now=t)
        t += (
            timedelta(minutes=10)
            if t < start + timedelta(hours=6)
            else timedelta(seconds=10)
        )
    spans = OnlineSpan.objects.filter(machine_id=device.machine_id).count()
    assert spans > 1, "10-minute gaps (over 30 s) start new spans"
    OnlineSpan.objects.filter(machine_id=device.machine_id).delete()
    t = start
    while t <= now:
        online_span_extend(machine_id=str(device.machine_id), now=t)
        t += timedelta(seconds=10)
    assert OnlineSpan.objects.filter(machine_id=device.machine_id).count() == 1
    device.refresh_from_db()
    fraction = device_online_fraction(device=device, now=now)
    assert abs(fraction - Decimal("0.25")) < Decimal("0.001")


@pytest.mark.django_db
def test_it_uses_the_time_since_first_seen_when_shorter(live_device):
    device = live_device()
    now = timezone.now()
    Device.objects.filter(id=device.id).update(first_seen_at=now - timedelta(hours=2))
    OnlineSpan.objects.filter(machine_id=device.machine_id).update(
        started_at=now - timedelta(hours=1), ended_at=now
    )
    device.refresh_from_db()
    assert abs(
        device_online_fraction(device=device, now=now) - Decimal("0.5")
    ) < Decimal("0.001")


@pytest.mark.django_db
def test_it_starts_a_new_device_at_60_and_moves_it_on_outcomes(live_device):
    device = live_device()
    assert device.score == 60
    score = device_outcome_record(
        device_id=device.id, success=False, reason="host_error", model_id="m"
    )
    assert score == 59, "one early failure cannot sink it"
    for _ in range(10):
        score = device_outcome_record(device_id=device.id, success=True, model_id="m")
    device.refresh_from_db()
    assert device.score == score > 59


@pytest.mark.django_db
def test_it_keeps_only_the_last_50_outcomes(live_device):
    device = live_device()
    OnlineSpan.objects.filter(machine_id=device.machine_id).update(
        started_at=device.first_seen_at
    )
    DeviceOutcome.objects.bulk_create(
        [
            DeviceOutcome(device=device, source="attempt", success=False)
            for _ in range(50)
        ]
    )
    low = device_score_recompute(device_id=device.id)
    DeviceOutcome.objects.bulk_create(
        [
            DeviceOutcome(device=device, source="attempt", success=True)
            for _ in range(50)
        ]
    )
    assert device_score_recompute(device_id=device.id) == 100
    assert low == 30  # 0 × 70 + 20 × online + 10 × latency(1)


@pytest.mark.django_db
def test_a_machine_offline_lowers_the_uptime_part(live_device):
    device = live_device()
    DeviceOutcome.objects.bulk_create(
        [
            DeviceOutcome(device=device, source="attempt", success=True)
            for _ in range(50)
        ]
    )
    now = timezone.now()
    Device.objects.filter(id=device.id).update(first_seen_at=now - timedelta(hours=24))
    OnlineSpan.objects.filter(machine_id=device.machine_id).update(
        started_at=now - timedelta(hours=12), ended_at=now
    )
    Machine.objects.filter(id=device.machine_id).update(last_heartbeat_at=now)
    assert (
        device_score_recompute(device_id=device.id, now=now) == 90
    )  # 70 + 20 × 0.5 + 10


def outcome_at(device, when, **fields) -> DeviceOutcome:
    outcome = DeviceOutcome.objects.create(device=device, source="attempt", **fields)
    DeviceOutcome.objects.filter(id=outcome.id).update(created_at=when)
    return outcome


@pytest.mark.django_db
@pytest.mark.parametrize("ttfts", [[140], [100, 151], [300, 100, 151], [7, 9, 8, 1]])
def test_the_medians_are_statistics_median_of_the_hour(live_device, ttfts):
    """The device's and the model's first-token medians are ``statistics.median``
    of the hour's values (the middle one, or the mean of the two middle ones);
    older and failed outcomes and other models are left out; other devices count
    in the model's median only, at once (no cache)."""
    device = live_device()
    now = timezone.now()
    for ttft in ttfts:
        outcome_at(device, now, success=True, model_id=MODEL, ttft_ms=ttft)
    outcome_at(device, now, success=False, model_id=MODEL, ttft_ms=5000)
    outcome_at(device, now, success=True, model_id="other", ttft_ms=4000)
    outcome_at(
        device, now - timedelta(minutes=61), success=True, model_id=MODEL, ttft_ms=1
    )
    inputs = device_score_inputs(device_id=device.id, model_id=MODEL, now=now)
    assert inputs.device_median == inputs.model_median == statistics.median(ttfts)
    other = live_device("other")
    outcome_at(other, now, success=True, model_id=MODEL, ttft_ms=10_000)
    inputs = device_score_inputs(device_id=device.id, model_id=MODEL, now=now)
    assert inputs.device_median == statistics.median(ttfts)
    assert inputs.model_median == statistics.median([*ttfts, 10_000])


@pytest.mark.django_db
@pytest.mark.parametrize("ttfts", [[140, 90], [100, 151, 7]])
def test_the_outcome_being_recorded_counts_in_both_medians(live_device, ttfts):
    """The outcome a record stores counts in the medians its own statement
    computes: the device's lands on its device-model row, and the score is the
    one the inputs read afterwards give (the model's median over every device)."""
    device, other = live_device(), live_device("other")
    now = timezone.now()
    for _ in range(49):  # a full window: the latency part moves the score
        outcome_at(device, now - timedelta(minutes=5), success=True, model_id=MODEL)
    for ttft in ttfts:
        outcome_at(other, now, success=True, model_id=MODEL, ttft_ms=ttft)
    score = device_outcome_record(
        device_id=device.id, success=True, model_id=MODEL, ttft_ms=333, now=now
    )
    assert DeviceModel.objects.get(device=device, model_id=MODEL).ttft_ms_recent == 333
    inputs = device_score_inputs(device_id=device.id, model_id=MODEL, now=now)
    assert inputs.model_median == statistics.median([*ttfts, 333])
    assert inputs.device_median == 333
    assert score == inputs.score
    alone = score_round(
        score_unrounded(
            outcomes=50,
            successes=50,
            online_fraction=inputs.online,
            model_median_ttft_ms=333,
            device_ttft_ms=333,
        )
    )
    assert score < alone, "the other device's faster first tokens count"


@pytest.mark.django_db
def test_without_a_model_the_latency_part_is_the_last_named_ones(live_device):
    """The model whose latency counts is that of the device's latest outcome that
    names one (an outcome without a model, like a missed claim, does not)."""
    device = live_device()
    now = timezone.now()
    outcome_at(
        device, now - timedelta(minutes=3), success=True, model_id="other", ttft_ms=90
    )
    outcome_at(
        device, now - timedelta(minutes=2), success=True, model_id=MODEL, ttft_ms=200
    )
    outcome_at(
        device, now - timedelta(minutes=1), success=False, reason="claim_timeout"
    )
    inputs = device_score_inputs(device_id=device.id, now=now)
    assert (inputs.model_id, inputs.outcomes, inputs.successes) == (MODEL, 3, 2)
    assert inputs.device_median == inputs.model_median == 200
    assert device_score_recompute(device_id=device.id, now=now) == inputs.score
    assert Device.objects.get(id=device.id).score == inputs.score


@pytest.mark.django_db
def test_an_outcome_frees_the_slot_with_the_score_write(live_device):
    """``slot_free`` gives back one slot (never below zero); the device's median
    first-token time for the model lands on its device-model row."""
    device = live_device(slots=2)
    Device.objects.filter(id=device.id).update(slots_used=1)
    device_outcome_record(
        device_id=device.id, success=True, model_id=MODEL, ttft_ms=120, slot_free=True
    )
    device_outcome_record(
        device_id=device.id, success=True, model_id=MODEL, ttft_ms=140, slot_free=True
    )
    device.refresh_from_db()
    assert device.slots_used == 0, "never below zero"
    assert DeviceModel.objects.get(device=device, model_id=MODEL).ttft_ms_recent == 130


@pytest.mark.django_db
def test_an_unknown_device_raises(db):
    with pytest.raises(Device.DoesNotExist):
        device_score_recompute(device_id=987654)
    with pytest.raises(Device.DoesNotExist):
        device_outcome_record(device_id=987654, success=True)
