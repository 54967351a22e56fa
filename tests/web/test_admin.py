"""Admin: every model registered with list filters and search; ledger read-only;
actions to pause or quarantine a device."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.urls import reverse

from hosts.models import Device

OUR_APPS = {"catalog", "hosts", "jobs", "billing", "support"}


@pytest.fixture
def staff_client(client, db):
    staff = get_user_model().objects.create_superuser(
        username="staff@example.com", email="staff@example.com", password="x"
    )
    client.force_login(staff)
    return client


def our_models():
    return [m for m in apps.get_models() if m._meta.app_label in OUR_APPS]


def test_it_registers_every_model():
    missing = [m.__name__ for m in our_models() if m not in admin.site._registry]
    assert missing == []


@pytest.mark.parametrize("model", our_models(), ids=lambda m: m.__name__)
def test_it_lists_each_model_with_search_and_filters(staff_client, busy_machine, model):
    model_admin = admin.site._registry[model]
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    response = staff_client.get(url, {"q": "rig"} if model_admin.search_fields else {})
    assert response.status_code == 200
    if model._meta.app_label in {"catalog", "hosts", "jobs", "support"}:
        assert model_admin.list_filter, f"{model.__name__} has no list filters"
        assert model_admin.search_fields, f"{model.__name__} has no search"


def test_it_keeps_the_ledger_read_only(staff_client, db):
    from billing.models import Entry, LedgerTransaction

    for model in (LedgerTransaction, Entry):
        if model in admin.site._registry:
            request = type(
                "R",
                (),
                {"user": get_user_model().objects.get(username="staff@example.com")},
            )()
            model_admin = admin.site._registry[model]
            assert not model_admin.has_add_permission(request)
            assert not model_admin.has_delete_permission(request)


def test_it_pauses_devices_by_action_and_quarantines_only_with_a_reason(
    staff_client, machine
):
    """Pausing is an action; quarantine and release are not (the host must be
    told why: the staff console), and the device page cannot flip it."""
    device = machine.devices.get()
    url = reverse("admin:hosts_device_changelist")
    response = staff_client.post(
        url, {"action": "pause_devices", "_selected_action": [device.id]}
    )
    assert response.status_code == 302
    assert Device.objects.get(id=device.id).paused
    page = staff_client.get(url).content.decode()
    assert "quarantine_devices" not in page and "release_quarantine" not in page
    assert reverse("staff:device", args=[device.id]) in page
    model_admin = admin.site._registry[Device]
    request = type("R", (), {"user": get_user_model().objects.get(is_staff=True)})()
    assert "quarantined" in model_admin.get_readonly_fields(request, device)


@pytest.mark.parametrize(
    "app,model",
    [
        ("hosts", "deviceoutcome"),
        ("hosts", "quarantinedecision"),
        ("jobs", "spotcheck"),
        ("jobs", "verification"),
        ("jobs", "job"),
        ("jobs", "attempt"),
        ("jobs", "rental"),
        ("billing", "earning"),
        ("billing", "entry"),
        ("billing", "ledgertransaction"),
        ("billing", "receiptcheck"),
        ("support", "ticketmessage"),
        ("hosts", "measurement"),
    ],
)
def test_audit_and_money_records_cannot_be_deleted_or_edited(
    staff_client, busy_machine, app, model
):
    """No delete, no bulk delete (the action is gone from the list), no edit."""
    model_class = apps.get_model(app, model)
    model_admin = admin.site._registry[model_class]
    request = type("R", (), {"user": get_user_model().objects.get(is_staff=True)})()
    assert not model_admin.has_delete_permission(request)
    assert not model_admin.has_change_permission(request)
    changelist = staff_client.get(reverse(f"admin:{app}_{model}_changelist"))
    assert changelist.status_code == 200
    assert 'value="delete_selected"' not in changelist.content.decode()


def test_the_admin_names_things_as_people_do(staff_client, busy_machine):
    from support.models import TicketMessage

    from support.services import ticket_open

    index = staff_client.get(reverse("admin:index")).content.decode()
    assert "Entries" in index and "Entrys" not in index
    assert "Failed capabilities" in index and "capabilitys" not in index
    ticket = ticket_open(
        author=busy_machine.owner, subject="help", body="my rig is offline"
    )
    message = TicketMessage.objects.get(ticket=ticket)
    assert str(message).startswith(busy_machine.owner.email + ", ")
    page = staff_client.get(
        reverse("admin:support_ticket_change", args=[ticket.id])
    ).content.decode()
    assert "TicketMessage object" not in page and "my rig is offline" in page


def test_money_reads_in_dollars_in_the_admin(staff_client, busy_machine):
    """Lists and record pages show ``*_nano`` amounts in dollars."""
    from jobs.models import Job

    job = Job.objects.filter(cost_nano__gt=0).first() or Job.objects.first()
    Job.objects.filter(id=job.id).update(cost_nano=1_234_567_890)
    listing = staff_client.get(reverse("admin:jobs_job_changelist")).content.decode()
    assert "$1.23" in listing and "Cost nano" not in listing
    page = staff_client.get(
        reverse("admin:jobs_job_change", args=[job.id])
    ).content.decode()
    assert "$1.23" in page and "Cost nano" not in page and "1234567890" not in page
    earnings = staff_client.get(
        reverse("admin:billing_earning_changelist")
    ).content.decode()
    assert "$0.00000192" in earnings and "Amount nano" not in earnings


def test_a_machine_reads_live_now_or_when_it_was_last_seen(staff_client, machine):
    """Not "Last heartbeat 4:36" for a live machine (its process's lease
    vouches for it between recorded heartbeats)."""
    from datetime import timedelta

    from django.utils import timezone

    from hosts.models import Machine

    url = reverse("admin:hosts_machine_changelist")
    assert Machine.objects.get(id=machine.id).is_online(timezone.now())
    assert "live now" in staff_client.get(url).content.decode()
    Machine.objects.filter(id=machine.id).update(
        connected=False, last_heartbeat_at=timezone.now() - timedelta(minutes=7)
    )
    assert "7\xa0minutes ago" in staff_client.get(url).content.decode()
