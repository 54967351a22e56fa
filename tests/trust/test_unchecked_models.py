"""A device whose models have no calibrated spot check is shown so, never
silently unchecked (issue 31 item 4, ``trust.checkpools``): its due check is
dropped, logged and counted; a rental of it is refused up front; its machine
page says so per model (and why a quarantine cannot end); staff see per model
what it has to check with."""

from __future__ import annotations

import json
import logging

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from prometheus_client import REGISTRY

from catalog.models import CatalogModel
from hosts.models import Device
from hosts.services import spot_check_mark_due
from jobs.models import CanaryPrompt, Rental
from tests.conftest import oracle_answer
from trust.canarypool import canary_pool_fill
from trust.checkpools import check_supply, device_checks_missing
from trust.spotchecks import spot_checks_take_due

pytestmark = pytest.mark.django_db

OTHER = "tiny-llama-3"
"""A catalog model this coordinator has no reference engine of."""


@pytest.fixture
def other_model(catalog):
    return CatalogModel.objects.create(
        id=OTHER,
        family="llama",
        context_length=512,
        vram_per_request_mb=64,
        price_completion_nano=100,
    )


@pytest.fixture
def checks_on(settings):
    settings.BALLAST_SPOT_CHECKS = True
    settings.BALLAST_SPOT_CHECK_MAX_DELAY_S = 0
    settings.BALLAST_CANARY_RATE = 0
    settings.BALLAST_CANARY_SECRET = "tests"
    return settings


def _dropped(model_id: str) -> float:
    value = REGISTRY.get_sample_value(
        "ballast_spot_checks_dropped_total", {"model": model_id}
    )
    return value or 0.0


def _calibrated_prompt(model_id: str) -> CanaryPrompt:
    """A prompt of the model whose right answer is established (as the fleet
    or a reference engine would establish it)."""
    row = CanaryPrompt.objects.create(
        model_id=model_id,
        index=1,
        messages=[{"role": "user", "content": "Which is bigger, 7 or 9? One word."}],
        params={"temperature": 0, "max_tokens": 8},
        expected="9",
        distractors=["7"],
    )
    row.status, row.reference_output = CanaryPrompt.Status.CALIBRATED, "9"
    row.save()
    return row


def test_a_check_no_pool_can_serve_is_dropped_logged_and_counted(
    other_model, live_device, checks_on, caplog, django_capture_on_commit_callbacks
):
    device = live_device("tiny", models=(OTHER,))
    Device.objects.filter(id=device.id).update(spot_check_due_at=None)
    assert spot_check_mark_due(device_id=device.id, reason="first_load")
    before = _dropped(OTHER)
    with (
        caplog.at_level(logging.WARNING, logger="ballast.spotchecks"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert spot_checks_take_due(machine_id=str(device.machine_id)) == []
    assert _dropped(OTHER) == before + 1
    assert f"no calibrated spot checks for {OTHER}" in caplog.text
    assert "check first_load dropped" in caplog.text
    device.refresh_from_db()
    assert device.spot_check_due_at is None, "dropped, not retried forever"
    assert device_checks_missing(device_id=device.id) == [OTHER]


def test_once_its_pool_holds_a_calibrated_check_the_device_is_checked(
    other_model, live_device, checks_on, django_capture_on_commit_callbacks
):
    device = live_device("tiny", models=(OTHER,))
    _calibrated_prompt(OTHER)
    assert device_checks_missing(device_id=device.id) == []
    Device.objects.filter(id=device.id).update(spot_check_due_at=None)
    assert spot_check_mark_due(device_id=device.id, reason="first_load")
    before = _dropped(OTHER)
    with django_capture_on_commit_callbacks(execute=True):
        jobs = spot_checks_take_due(machine_id=str(device.machine_id))
    assert [(j.model_id, j.is_spot_check, j.target_device_id) for j in jobs] == [
        (OTHER, True, device.id)
    ]
    assert _dropped(OTHER) == before


def test_a_device_checked_through_one_of_its_models_is_not_missing_checks(
    other_model, live_device, checks_on
):
    """A device running both models is checked through the reference model's
    pool; only the other model is listed as not spot-checked yet."""
    canary_pool_fill(model_id="smollm2-135m-instruct", keep=1, answer=oracle_answer)
    both = live_device("both", models=("smollm2-135m-instruct", OTHER))
    assert device_checks_missing(device_id=both.id) == []


def test_a_rental_of_an_unchecked_device_is_refused_up_front(
    other_model, live_device, checks_on, api_key
):
    device = live_device("tiny", models=(OTHER,))
    answer = Client().post(
        "/v1/rentals",
        data={"device": device.id, "hours": 1},
        content_type="application/json",
        headers={"authorization": f"Bearer {api_key}"},
    )
    assert answer.status_code == 409, answer.content
    error = json.loads(answer.content)["error"]
    assert error["code"] == "device_unchecked" and error["param"] == "device"
    assert f"no calibrated checks for {OTHER}" in error["message"]
    assert not Rental.objects.exists()
    _calibrated_prompt(OTHER)
    answer = Client().post(
        "/v1/rentals",
        data={"device": device.id, "hours": 1},
        content_type="application/json",
        headers={"authorization": f"Bearer {api_key}"},
    )
    assert answer.status_code == 201, answer.content
    assert json.loads(answer.content)["status"] == "pending"


def test_the_machine_page_says_a_device_is_not_spot_checked_yet(
    client, owner, other_model, live_device, checks_on
):
    device = live_device("tiny", models=(OTHER,))
    Device.objects.filter(id=device.id).update(
        quarantined=True,
        quarantine_reason=Device.QuarantineReason.FAILURES,
        quarantined_at=timezone.now(),
    )
    client.force_login(owner)

    def page() -> str:
        return client.get(f"/machines/{device.machine_id}/").content.decode()

    html = page()
    said = f"not spot-checked yet: no calibrated checks for <code>{OTHER}</code>"
    assert said in html
    assert "so it cannot leave quarantine yet; it cannot be rented meanwhile" in html
    _calibrated_prompt(OTHER)
    html = page()
    assert "not spot-checked yet" not in html
    assert "cannot leave quarantine yet" not in html


def test_staff_see_per_model_what_it_has_to_check_with(
    client, other_model, live_device, checks_on
):
    canary_pool_fill(model_id="smollm2-135m-instruct", keep=2, answer=oracle_answer)
    live_device("tiny", models=(OTHER,))
    now = timezone.now()
    other = check_supply(model=other_model, now=now)
    assert (other.checked, other.checks_calibrated, other.reference_engine) == (
        False,
        0,
        False,
    )
    assert (other.verifiers, other.verification_calibrated) == (0, False)
    reference = check_supply(
        model=CatalogModel.objects.get(id="smollm2-135m-instruct"), now=now
    )
    assert (reference.checked, reference.checks_unused) == (True, 2)
    staff = get_user_model().objects.create_superuser(
        username="staff", email="staff@example.com", password="x"
    )
    client.force_login(staff)
    html = client.get(reverse("staff:fleet")).content.decode()
    row = html[html.index(f'id="fleet-{OTHER}"') :]
    row = row[: row.index("</tr>")]
    assert '<span class="badge bad">not calibrated</span> 0 unused of 0' in row
    assert "no reference engine on the coordinator" in row
    assert "0 verifiers available, 0 trusted" in row
    row = html[html.index('id="fleet-smollm2-135m-instruct"') :]
    row = row[: row.index("</tr>")]
    assert '<span class="badge ok">calibrated</span> 2 unused of 2' in row
