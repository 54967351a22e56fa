"""The staff console (issue 35 item 2): the fleet per model, a renter's and a
device's whole picture, the reason of a failed check kept on its outcome,
quarantine and release with a reason the host reads on the machine page and by
email, staff reading a host's machine page; everyone else refused."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from hosts.models import Device, DeviceOutcome, QuarantineDecision
from hosts.services import DecisionRefused, device_quarantine_by_staff
from jobs.models import ApiKey, Job
from jobs.services import api_key_cap_set, api_key_create
from support.services import ticket_open
from trust.failures import device_check_failed

from .conftest import MODEL, attempt_make


@pytest.fixture
def staff(db):
    return get_user_model().objects.create_superuser(
        username="staff", email="staff@example.com", password="x"
    )


@pytest.fixture
def staff_client(client, staff):
    client.force_login(staff)
    return client


def test_the_console_is_for_staff_only(client, stranger, busy_machine, renter):
    device = busy_machine.devices.get()
    urls = [
        reverse("staff:fleet"),
        reverse("staff:renter", args=[renter.id]),
        reverse("staff:machine", args=[busy_machine.id]),
        reverse("staff:device", args=[device.id]),
    ]
    for url in urls:
        assert client.get(url)["Location"].startswith("/admin/login/")
    client.force_login(stranger)
    for url in urls:
        assert client.get(url)["Location"].startswith("/admin/login/")
    answer = client.post(
        reverse("staff:device_decide", args=[device.id]),
        {"action": "quarantine", "reason": "a stranger tries to quarantine"},
    )
    assert answer.status_code == 302
    assert not Device.objects.get(id=device.id).quarantined


def test_the_fleet_reads_per_model(staff_client, busy_machine):
    html = staff_client.get(reverse("staff:fleet")).content.decode()
    row = html[html.index(f'id="fleet-{MODEL}"') :]
    row = row[: row.index("</tr>")]
    # rig-1's device is live with the model loaded, 2 slots; busy_machine's
    # three attempts ended just now, one of them a failure
    assert 'data-label="Devices online" class="num">1<' in row
    assert "2 of 2" in row
    assert 'data-label="Attempts · failed (1 h)" class="num">3 · ' in row
    assert ">1</span>" in row.split("Attempts · failed")[1]


def test_a_renter_s_whole_picture(staff_client, busy_machine, renter):
    _, _ = api_key_create(user=renter, name="my-app")
    key = ApiKey.objects.get(user=renter, name="my-app")
    api_key_cap_set(user=renter, key_id=key.id, cap_nano=2 * 10**9, period="day")
    Job.objects.filter(renter=renter).update(api_key=key)
    ticket_open(author=renter, subject="Where did my credit go?", body="see above")
    html = staff_client.get(reverse("staff:renter", args=[renter.id])).content.decode()
    assert 'id="renter-balance"><span class="usd">$5.00</span>' in html
    keys = html[html.index('id="renter-keys"') :]
    assert "my-app" in keys and "$2.00" in keys and "per day" in keys.lower()
    jobs = html[html.index('id="renter-jobs"') :]
    assert "rig-1/gpu0" in jobs and "first_token_timeout" in jobs and "180 ms" in jobs
    credit = html[html.index('id="renter-credit"') :]
    assert "Credit added" in credit
    assert "Where did my credit go?" in html[html.index('id="renter-tickets"') :]


def test_a_failed_check_keeps_its_job_and_reason_on_the_outcome(
    staff_client, machine, renter
):
    """"Why was my device quarantined?" is answered from the outcome row (not
    the log): the checked job and the finding in words."""
    device = machine.devices.get()
    job = attempt_make(device, renter=None).job
    device_check_failed(
        device_id=device.id,
        model_id=MODEL,
        detail="spot check 7: expected answer missing",
        now=timezone.now(),
        job_ref=str(job.id),
    )
    outcome = DeviceOutcome.objects.filter(device=device, success=False).get()
    assert outcome.job_ref == str(job.id)
    assert outcome.detail == "spot check 7: expected answer missing"
    html = staff_client.get(reverse("staff:device", args=[device.id])).content.decode()
    table = html[html.index('id="device-outcomes"') :]
    assert "failed a check of its honesty" in table
    assert "spot check 7: expected answer missing" in table
    assert reverse("admin:jobs_job_change", args=[job.id]) in table


def test_staff_quarantine_and_release_with_a_reason_the_host_reads(
    staff_client, busy_machine, settings, django_capture_on_commit_callbacks
):
    owner_client = Client()
    owner_client.force_login(busy_machine.owner)
    settings.BALLAST_PUBLIC_URL = "https://ballast.example.com"
    device = busy_machine.devices.get()
    decide = reverse("staff:device_decide", args=[device.id])
    reason = "Its answers disagree with every other device on smollm2."
    with pytest.raises(DecisionRefused):
        device_quarantine_by_staff(device_id=device.id, staff=None, reason="short")
    with django_capture_on_commit_callbacks(execute=True):  # the email's
        answer = staff_client.post(decide, {"action": "quarantine", "reason": reason})
    assert answer.status_code == 302
    device.refresh_from_db()
    assert device.quarantined and device.quarantine_reason == "staff"
    decision = QuarantineDecision.objects.get(device=device)
    assert decision.reason == reason and decision.staff.username == "staff"
    # the owner: an email with the reason and an absolute link to the machine
    (sent,) = mail.outbox
    assert sent.to == [busy_machine.owner.email] and reason in sent.body
    assert f"https://ballast.example.com/machines/{busy_machine.id}/" in sent.body
    # … and the machine page says it
    page = owner_client.get(reverse("hosts:machine", args=[busy_machine.id]))
    notice = page.content.decode()
    notice = notice[notice.index('id="decision-0"') :]
    assert "Ballast staff quarantined gpu0" in notice and reason in notice
    # released, again with a reason
    again = staff_client.post(decide, {"action": "release", "reason": "x"})
    assert again.status_code == 302 and Device.objects.get(id=device.id).quarantined
    with django_capture_on_commit_callbacks(execute=True):
        staff_client.post(
            decide,
            {"action": "release", "reason": "Checked by hand: its answers are right."},
        )
    assert not Device.objects.get(id=device.id).quarantined
    assert len(mail.outbox) == 2 and "Checked by hand" in mail.outbox[1].body
    page = owner_client.get(reverse("hosts:machine", args=[busy_machine.id]))
    assert "released gpu0 from quarantine" in page.content.decode()


def test_staff_read_a_host_s_machine_page_without_its_controls(
    staff_client, busy_machine
):
    url = reverse("hosts:machine", args=[busy_machine.id])
    answer = staff_client.get(url)
    assert answer.status_code == 200
    html = answer.content.decode()
    assert 'id="machine-settings"' not in html and 'id="token-rotate"' not in html
    assert reverse("staff:machine", args=[busy_machine.id]) in html


def test_a_stranger_still_gets_a_404_for_a_host_s_machine(stranger_client, machine):
    url = reverse("hosts:machine", args=[machine.id])
    assert stranger_client.get(url).status_code == 404


def test_the_machine_picture_reads_live_now_and_its_uptime(staff_client, busy_machine):
    html = staff_client.get(
        reverse("staff:machine", args=[busy_machine.id])
    ).content.decode()
    assert 'id="machine-seen">live now<' in html
    assert 'id="host-page"' in html
    assert "failure" in html[html.index('id="machine-outcomes"') :]


def test_the_machine_page_says_a_device_is_rented_now_and_until_when(
    owner_client, machine, renter
):
    from datetime import timedelta

    from jobs.models import Rental

    device = machine.devices.get()
    now = timezone.now()
    Rental.objects.create(
        renter=renter,
        device=device,
        hours=2,
        price_per_hour_nano=200_000_000,
        status=Rental.Status.LIVE,
        starts_at=now,
        ends_at=now + timedelta(hours=2),
    )
    page = owner_client.get(reverse("hosts:machine", args=[machine.id]))
    html = page.content.decode()
    notice = html[html.index('id="rented-0"') :]
    notice = notice[: notice.index("</div>")]
    assert "gpu0 is rented now" in notice and "until" in notice
    assert f"{(now + timedelta(hours=2)):%H:%M} UTC" in notice
    # and what happens after a failed load, said honestly (a fixed build loads it)
    assert "does not offer them to this build again" not in html
    assert "the model gets jobs as soon as it loads" in html
