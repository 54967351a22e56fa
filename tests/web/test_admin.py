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


def test_it_pauses_and_quarantines_devices_by_action(staff_client, machine):
    device = machine.devices.get()
    url = reverse("admin:hosts_device_changelist")
    for action in ("pause_devices", "quarantine_devices"):
        response = staff_client.post(
            url, {"action": action, "_selected_action": [device.id]}
        )
        assert response.status_code == 302
    device = Device.objects.get(id=device.id)
    assert device.paused and device.quarantined and device.quarantined_at
    staff_client.post(
        url, {"action": "release_quarantine", "_selected_action": [device.id]}
    )
    assert not Device.objects.get(id=device.id).quarantined
