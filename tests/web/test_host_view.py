"""What a host looks for on its pages (issue 24 item 5): waiting for the first
heartbeat with what to check, the online timeline, live temperature and VRAM,
why a segment earned nothing, renaming and retiring (kept in the records, listed
apart), unique names and known regions with clear errors."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.models import Earning, ReceiptCheck
from hosts.models import Machine
from hosts.services import machine_register
from jobs.models import Attempt

from .conftest import attempt_make, connect


def page(client, machine) -> str:
    response = client.get(reverse("hosts:machine", args=[machine.id]))
    assert response.status_code == 200
    return response.content.decode()


def live(client, machine) -> str:
    response = client.get(
        reverse("hosts:device_rows", args=[machine.id]), HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    return response.content.decode()


def test_a_new_machine_waits_for_its_first_heartbeat_and_says_what_to_check(
    owner_client, owner, catalog
):
    machine, _ = machine_register(owner=owner, name="desk")
    html = page(owner_client, machine)
    assert 'id="waiting"' in html and "Waiting for the first heartbeat" in html
    assert "No agent has connected with this machine" in html
    assert "ballast-agent run --server http://testserver --token" in html
    assert f"it starts <code>{machine.token_prefix}…</code>" in html
    assert "refused the machine token (HTTP 403)" in html
    assert "cannot reach the coordinator" in html
    assert 'data-status="waiting"' in html
    # the polled fragment carries the same box, and loses it with the heartbeat
    assert 'id="waiting"' in live(owner_client, machine)
    connect(machine)
    fragment = live(owner_client, machine)
    assert 'id="waiting"' not in fragment and 'data-status="online"' in fragment
    assert 'id="waiting"' not in page(owner_client, machine)


def test_a_connected_agent_without_a_heartbeat_is_told_apart(
    owner_client, owner, catalog
):
    from hosts.services import machine_hello

    machine, _ = machine_register(owner=owner, name="desk")
    machine_hello(
        machine_id=str(machine.id),
        channel_name="test.desk",
        hello={
            "agent_version": "0.1.0",
            "engine_name": "llamacpp",
            "engine_version": "0.3.16",
            "public_key": "A" * 43 + "=",
            "accepts_serverless": True,
            "devices": [{"index": 0, "name": "RTX 4090", "vram_total_mb": 24576}],
        },
    )
    fragment = live(owner_client, machine)
    assert "An agent connected with this machine" in fragment
    assert "said hello" in fragment


def test_the_live_part_shows_temperature_and_vram_as_gauges(
    owner_client, owner, catalog, settings
):
    machine, _ = machine_register(owner=owner, name="hot-rig")
    connect(machine, temp_c=90.0, vram_free_mb=6144)
    fragment = live(owner_client, machine)
    assert "90 °C" in fragment and "too hot: no new jobs" in fragment
    assert "18432 of 24576 MiB" in fragment  # in use: total − free
    assert '<rect class="fill" width="75"' in fragment  # 75 % of the VRAM in use
    assert '<rect class="fill" width="100"' in fragment  # at the 88 °C limit, full
    assert "6144 MiB free" in fragment


def test_the_timeline_draws_each_day_as_a_bar(owner_client, machine):
    """From the day it was registered, at most the last 14 UTC days."""
    html = page(owner_client, machine)
    timeline = html[html.index('id="uptime-timeline"') :]
    assert timeline.count('class="day" data-day=') == 1  # registered today
    Machine.objects.filter(id=machine.id).update(
        created_at=timezone.now() - timedelta(days=30)
    )
    html = page(owner_client, machine)
    timeline = html[html.index('id="uptime-timeline"') :]
    assert timeline.count('class="day" data-day=') == 14
    assert '<svg class="day-bar" viewBox="0 0 1440 10"' in timeline
    assert '<rect class="on"' in timeline and "<title>online " in timeline
    assert '<rect class="off"' in timeline  # the days before its first heartbeat
    assert '<rect class="later"' in timeline  # the rest of today
    assert "Online <strong>" in timeline


ATTEMPT_FIELDS = (
    "output_chars",
    "tokens_billed",
    "receipt_valid",
    "token_count_flagged",
)


@pytest.mark.parametrize(
    "setup,reason",
    [
        (
            {"outcome": "first_token_timeout", "output_chars": 0},
            "no first token in time after the claim",
        ),
        (
            {"outcome": "died_midstream", "output_chars": 40, "tokens_billed": 10},
            "the stream died mid-answer, so no receipt came",
        ),
        (
            {"outcome": "cancelled", "output_chars": 0},
            "cancelled before any output",
        ),
        (
            {"outcome": "succeeded", "output_chars": 40, "tokens_billed": 0},
            "the renter left before the answer was delivered (not streamed)",
        ),
        (
            {"outcome": "succeeded", "verdict": "missing"},
            "no receipt: the agent sent none",
        ),
        (
            {"outcome": "succeeded", "verdict": "invalid", "receipt_valid": False},
            "the receipt did not verify",
        ),
        (
            {
                "outcome": "succeeded",
                "verdict": "valid",
                "receipt_valid": True,
                "token_count_flagged": True,
            },
            "the reported token count was not believable (flagged)",
        ),
        (
            {
                "outcome": "succeeded",
                "verdict": "valid",
                "receipt_valid": True,
                "earning": Earning.Status.REVERSED,
            },
            "reversed: a check of this device failed while the earning was held",
        ),
    ],
)
def test_a_segment_that_earned_nothing_says_why(
    owner_client, machine, renter, setup, reason
):
    device = machine.devices.get()
    attempt = attempt_make(device, renter=renter, outcome=setup["outcome"])
    fields = {k: setup[k] for k in ATTEMPT_FIELDS if k in setup}
    Attempt.objects.filter(id=attempt.id).update(**fields)
    if "verdict" in setup:
        ReceiptCheck.objects.create(
            attempt=attempt, device=device, verdict=setup["verdict"]
        )
    if "earning" in setup:
        Earning.objects.create(
            attempt=attempt,
            device=device,
            host=machine.owner,
            amount_nano=5_000,
            status=setup["earning"],
            release_at=timezone.now() + timedelta(hours=24),
        )
    html = page(owner_client, machine)
    jobs = html[html.index('id="recent-jobs"') : html.index("Failed capabilities")]
    assert reason in jobs
    assert jobs.count('class="why"') == 1


def test_a_paid_segment_shows_its_earning_and_no_reason(owner_client, machine, renter):
    device = machine.devices.get()
    attempt_make(device, renter=renter, earn_nano=1_920)
    html = page(owner_client, machine)
    jobs = html[html.index('id="recent-jobs"') : html.index("Failed capabilities")]
    assert "$0.00000192" in jobs and 'class="why"' not in jobs


def test_the_owner_renames_a_machine_and_a_taken_name_is_refused(
    owner_client, owner, machine
):
    machine_register(owner=owner, name="rig-2")
    url = reverse("hosts:machine_rename", args=[machine.id])
    response = owner_client.post(url, {"name": "Rig-2"}, follow=True)
    assert "Not renamed: You already have a machine of this name" in (
        response.content.decode()
    )
    machine.refresh_from_db()
    assert machine.name == "rig-1"
    response = owner_client.post(url, {"name": "living-room"}, follow=True)
    assert "rig-1 is now living-room." in response.content.decode()
    machine.refresh_from_db()
    assert machine.name == "living-room"


def test_registering_a_taken_name_or_an_unknown_region_says_so(owner_client, machine):
    url = reverse("hosts:machine_register")
    html = owner_client.post(url, {"name": "RIG-1", "region": "eu"}).content.decode()
    assert "You already have a machine of this name" in html
    html = owner_client.post(url, {"name": "desk", "region": "moon"}).content.decode()
    assert "unknown region &#x27;moon&#x27;: use one of af, ap-east" in html
    assert Machine.objects.count() == 1
    form = owner_client.get(url).content.decode()
    assert '<option value="us-east">us-east — United States, east</option>' in form


def test_settings_refuse_an_unknown_region(owner_client, machine):
    url = reverse("hosts:machine_settings", args=[machine.id])
    response = owner_client.post(url, {"region": "narnia"}, follow=True)
    assert "Settings not saved: unknown region" in response.content.decode()
    machine.refresh_from_db()
    assert machine.region == "eu"


def test_retiring_needs_the_tick_box_then_lists_the_machine_apart(
    owner_client, machine, renter
):
    attempt_make(machine.devices.get(), renter=renter, earn_nano=3_200)
    url = reverse("hosts:machine_retire", args=[machine.id])
    response = owner_client.post(url, {}, follow=True)
    assert "Not retired: tick the box to confirm." in response.content.decode()
    machine.refresh_from_db()
    assert machine.retired_at is None
    response = owner_client.post(url, {"confirm": "1"}, follow=True)
    html = response.content.decode()
    assert response.redirect_chain[-1][0] == reverse("hosts:dashboard")
    assert "rig-1 retired" in html
    rows = html[html.index('id="machine-rows"') : html.index("Retired machines")]
    assert "rig-1" not in rows
    retired = html[html.index('id="retired-machines"') :]
    assert f'id="retired-{machine.id}"' in retired and "$0.0000032" in retired
    # its page keeps the records, without controls or a live poll
    html = page(owner_client, machine)
    assert 'data-status="retired"' in html and "$0.0000032" in html
    assert 'id="token-rotate"' not in html and 'hx-get="' not in html


@pytest.mark.parametrize(
    "name,data",
    [
        ("hosts:machine_pause", {"paused": "0"}),
        ("hosts:machine_settings", {"region": "eu", "accepts_serverless": "on"}),
        ("hosts:machine_rename", {"name": "again"}),
        ("hosts:machine_token_rotate", {"confirm": "1"}),
        ("hosts:machine_key_reset", {}),
        ("hosts:machine_retire", {"confirm": "1"}),
    ],
)
def test_a_retired_machine_cannot_change(owner_client, machine, name, data):
    from hosts.web_services import machine_retire

    machine_retire(machine=machine)
    before = Machine.objects.filter(id=machine.id).values().get()
    response = owner_client.post(reverse(name, args=[machine.id]), data, follow=True)
    assert "is retired: it can no longer change" in response.content.decode()
    assert Machine.objects.filter(id=machine.id).values().get() == before


def test_a_stranger_can_neither_rename_nor_retire(stranger_client, machine):
    for name, data in (
        ("hosts:machine_rename", {"name": "mine"}),
        ("hosts:machine_retire", {"confirm": "1"}),
    ):
        response = stranger_client.post(reverse(name, args=[machine.id]), data)
        assert response.status_code == 404
    machine.refresh_from_db()
    assert machine.name == "rig-1" and machine.retired_at is None


def test_a_long_name_is_kept_wrappable(owner_client, owner, catalog):
    machine, _ = machine_register(
        owner=owner, name="the-big-gaming-pc-in-the-living-room-under-the-stairs-2024"
    )
    connect(machine)
    html = owner_client.get(reverse("hosts:dashboard")).content.decode()
    assert 'class="name"' in html
