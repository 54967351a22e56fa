"""The score's fixed statements (``hosts.services._score_inputs``) read what the ORM
rules read (DESIGN.md "Reliability score"), on SQLite and PostgreSQL alike."""

from __future__ import annotations

import random
import statistics
from datetime import timedelta

import pytest
from django.utils import timezone

from hosts import services
from hosts.models import (
    CoordinatorLease,
    Device,
    DeviceModel,
    DeviceOutcome,
    Machine,
    OnlineSpan,
)
from hosts.scoring import WINDOW, score_round, score_unrounded

pytestmark = pytest.mark.django_db

MODEL = "smollm2-135m-instruct"


def history(device, now, *, seed: int) -> None:
    """70 outcomes over 2 h (mixed results, models and first-token times) and spans
    with gaps over 30 h, the newest ending 5 min ago."""
    rng = random.Random(seed)
    for i in range(70):
        outcome = DeviceOutcome.objects.create(
            device=device,
            source=rng.choice(["attempt", "spot_check"]),
            success=rng.random() < 0.8,
            model_id=rng.choice([MODEL, MODEL, "other", ""]),
            ttft_ms=rng.choice([None, rng.randint(50, 900)]),
        )
        DeviceOutcome.objects.filter(id=outcome.id).update(
            created_at=now - timedelta(minutes=120 - i * 1.7)
        )
    OnlineSpan.objects.filter(machine_id=device.machine_id).delete()
    for hours_ago, length in [(30, 3), (20, 2), (9, 4), (2, 1.9)]:
        OnlineSpan.objects.create(
            machine_id=device.machine_id,
            started_at=now - timedelta(hours=hours_ago),
            ended_at=now - timedelta(hours=hours_ago - length),
        )
    Device.objects.filter(id=device.id).update(first_seen_at=now - timedelta(hours=40))


def by_the_orm(device_id: int, model_id: str, now) -> dict:
    """The score's inputs as the ORM functions compute them."""
    device = Device.objects.select_related("machine", "machine__lease").get(
        id=device_id
    )
    last = list(
        DeviceOutcome.objects.filter(device_id=device_id).values_list(
            "success", flat=True
        )[:WINDOW]
    )
    model_id = model_id or (
        DeviceOutcome.objects.filter(device_id=device_id)
        .exclude(model_id="")
        .values_list("model_id", flat=True)
        .first()
    )

    def median(**where):  # the rule in Python (PostgreSQL's is checked against it)
        hour = DeviceOutcome.objects.filter(
            success=True,
            ttft_ms__isnull=False,
            created_at__gte=now - timedelta(hours=1),
            **where,
        ).values_list("ttft_ms", flat=True)
        return statistics.median(hour) if hour else None

    return {
        "model": model_id,
        "outcomes": len(last),
        "successes": sum(last),
        "online": services.device_online_fraction(device=device, now=now),
        "model_median": median(model_id=model_id),
        "device_median": median(device_id=device_id, model_id=model_id),
    }


@pytest.mark.parametrize(
    "liveness", ["live", "offline", "lease lapsed", "stale", "lease vouches"]
)
@pytest.mark.parametrize("model_id", [MODEL, ""])
def test_the_fixed_reads_match_the_orm_rules(live_device, liveness, model_id):
    device = live_device()
    now = timezone.now()
    history(device, now, seed=len(liveness) + len(model_id))
    lease = CoordinatorLease.objects.create(
        name="test",
        lease_until=now + timedelta(seconds=5)
        if liveness == "lease vouches"
        else now - timedelta(minutes=3),
    )
    machine = Machine.objects.filter(id=device.machine_id)
    machine.update(
        connected=liveness != "offline",
        stale=liveness == "stale",
        lease=lease,
        last_heartbeat_at=now - timedelta(seconds=5 if liveness == "live" else 400),
    )
    DeviceModel.objects.filter(device=device, model_id=MODEL).update(ttft_ms_recent=321)
    expected = by_the_orm(device.id, model_id, now)
    services._model_medians.clear()
    inputs = services._score_inputs(device_id=device.id, model_id=model_id, now=now)
    got = {name: getattr(inputs, name) for name in expected if name != "model"}
    assert got == {k: v for k, v in expected.items() if k != "model"}
    resolved = model_id or expected["model"]
    assert inputs.ttft_ms_recent == (
        DeviceModel.objects.filter(device=device, model_id=resolved)
        .values_list("ttft_ms_recent", flat=True)
        .first()
    )
    score = score_round(
        score_unrounded(
            outcomes=expected["outcomes"],
            successes=expected["successes"],
            online_fraction=expected["online"],
            model_median_ttft_ms=expected["model_median"],
            device_ttft_ms=expected["device_median"],
        )
    )
    services._model_medians.clear()
    assert (
        services.device_score_recompute(device_id=device.id, now=now, model_id=model_id)
        == score
    )
    assert Device.objects.get(id=device.id).score == score


@pytest.mark.parametrize("ttfts", [[140], [100, 151], [300, 100, 151], [7, 9, 8, 1]])
def test_the_medians_are_statistics_median_of_the_hour(live_device, ttfts):
    """The device's and the model's first-token medians (the database's on
    PostgreSQL) are ``statistics.median`` of the hour's values: the middle one,
    or the mean of the two middle ones; older and failed outcomes left out."""
    device = live_device()
    now = timezone.now()
    for ttft in [*ttfts, 5000]:
        DeviceOutcome.objects.create(
            device=device, success=ttft != 5000, model_id=MODEL, ttft_ms=ttft
        )
    old = DeviceOutcome.objects.create(
        device=device, success=True, model_id=MODEL, ttft_ms=1
    )
    DeviceOutcome.objects.filter(id=old.id).update(
        created_at=now - timedelta(minutes=61)
    )
    services._model_medians.clear()
    inputs = services._score_inputs(device_id=device.id, model_id=MODEL, now=now)
    assert inputs.device_median == statistics.median(ttfts)
    assert inputs.model_median == statistics.median(ttfts)
    assert services.device_ttft_median(
        device_id=device.id, model_id=MODEL, now=now
    ) == statistics.median(ttfts)


def test_an_outcome_frees_the_slot_with_the_score_write(live_device):
    device = live_device(slots=2)
    Device.objects.filter(id=device.id).update(slots_used=1)
    services.device_outcome_record(
        device_id=device.id, success=True, model_id=MODEL, ttft_ms=120, slot_free=True
    )
    services.device_outcome_record(
        device_id=device.id, success=True, model_id=MODEL, ttft_ms=140, slot_free=True
    )
    device.refresh_from_db()
    assert device.slots_used == 0, "never below zero"
    assert DeviceModel.objects.get(device=device, model_id=MODEL).ttft_ms_recent == 130


def test_an_unknown_device_raises(db):
    with pytest.raises(Device.DoesNotExist):
        services.device_score_recompute(device_id=987654)
