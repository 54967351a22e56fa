"""The host dashboard: the owner's machines with live status, refreshed by htmx."""

from __future__ import annotations

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from hosts.models import Machine
from hosts.services import machine_register

from .conftest import connect


def test_it_sends_anonymous_visitors_to_log_in(client, db):
    response = client.get(reverse("hosts:dashboard"))
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_it_lists_only_the_owners_machines(owner_client, machine, stranger):
    other, _ = machine_register(owner=stranger, name="strangers-rig")
    response = owner_client.get(reverse("hosts:dashboard"))
    assert response.status_code == 200
    assert b"rig-1" in response.content
    assert b"strangers-rig" not in response.content


def test_it_shows_status_score_slots_and_earnings(owner_client, busy_machine):
    response = owner_client.get(reverse("hosts:dashboard"))
    html = response.content.decode()
    row = html[html.index(f'id="machine-{busy_machine.id}"') :]
    assert 'data-status="online"' in row
    assert "NVIDIA GeForce RTX 4090" in row
    assert "0 / 2" in row  # slots busy / total
    assert "$0.00000192" in html  # held: 1,920 nano-USD
    assert "$0.0000032" in html  # available 3,200 nano-USD


def test_it_shows_offline_and_paused(owner_client, owner, machine, catalog):
    Machine.objects.filter(id=machine.id).update(
        last_heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    paused, _ = machine_register(owner=owner, name="rig-2")
    connect(paused)
    Machine.objects.filter(id=paused.id).update(paused=True)
    html = owner_client.get(reverse("hosts:dashboard")).content.decode()
    assert f'id="machine-{machine.id}" data-status="offline"' in html
    assert f'id="machine-{paused.id}" data-status="paused"' in html


def test_it_serves_the_rows_fragment_to_htmx(owner_client, machine):
    response = owner_client.get(reverse("hosts:machine_rows"), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert b"<html" not in response.content
    assert f'id="machine-{machine.id}"'.encode() in response.content


def test_it_redirects_the_fragment_to_the_page_without_htmx(owner_client, machine):
    response = owner_client.get(reverse("hosts:machine_rows"))
    assert response.status_code == 302
    assert response["Location"] == reverse("hosts:dashboard")


def test_it_gives_every_hx_get_an_ordinary_href(owner_client, machine):
    html = owner_client.get(reverse("hosts:dashboard")).content.decode()
    assert 'hx-get="/machines/rows/"' in html
    poll = html[
        html.index('id="rows-poll"') - 40 : html.index('hx-get="/machines/rows/"')
    ]
    assert 'href="/machines/"' in poll
