"""DESIGN.md "Spot checks": quarantine on 3 failed checks of the last 20 or a score
under 50; release after 3 passes in a row — reproducing shared/vectors/quarantine.json."""

from __future__ import annotations

import pytest

from hosts.models import Device, DeviceOutcome
from hosts.services import device_outcome_record, device_quarantine_release_judge
from tests.vectors import vectors

CASES = vectors("quarantine")["cases"]


@pytest.mark.django_db
@pytest.mark.parametrize("case", CASES, ids=[c["note"] for c in CASES])
def test_it_reproduces_every_worked_quarantine_sequence(case, live_device, settings):
    settings.BALLAST_SPOT_CHECKS = False  # judge only: nothing is sent here
    device = live_device()
    # the vectors assume the score stays >= 50: a long clean record of jobs
    DeviceOutcome.objects.bulk_create(
        [
            DeviceOutcome(device=device, source="attempt", success=True)
            for _ in range(50)
        ]
    )
    states = []
    for check in case["checks"]:
        passed = check == "P"
        device_outcome_record(
            device_id=device.id, success=passed, source="spot_check", model_id="m"
        )
        if passed:
            device_quarantine_release_judge(device_id=device.id)
        device.refresh_from_db()
        assert device.score >= 50
        states.append(device.quarantined)
    assert states == case["quarantined_after"]


@pytest.mark.django_db
def test_it_quarantines_when_a_failure_leaves_the_score_under_50(live_device, settings):
    settings.BALLAST_SPOT_CHECKS = False
    device = live_device()
    DeviceOutcome.objects.bulk_create(
        [
            DeviceOutcome(device=device, source="attempt", success=False)
            for _ in range(49)
        ]
    )
    device_outcome_record(
        device_id=device.id, success=False, reason="host_error", model_id="m"
    )
    device.refresh_from_db()
    assert device.score < 50 and device.quarantined


@pytest.mark.django_db
def test_a_quarantined_device_gets_a_spot_check_marked_due(live_device, settings):
    settings.BALLAST_SPOT_CHECK_MAX_DELAY_S = 0
    device = live_device()
    for _ in range(3):
        device_outcome_record(
            device_id=device.id, success=False, source="spot_check", model_id="m"
        )
    device = Device.objects.get(id=device.id)
    assert device.quarantined
    assert device.spot_check_due_at is not None
