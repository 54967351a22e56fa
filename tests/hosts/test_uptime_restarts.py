"""DESIGN.md "Fair to honest hosts": uptime survives restarts (issue 32 item 2).
The services in the order a connection calls them; the real processes are
tests/e2e/test_restarts.py."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from hosts.models import Device, OnlineSpan
from hosts.services import (
    device_online_fraction,
    machine_disconnect,
    machine_heartbeat,
    machine_hello,
)
from tests.devices import MODEL, device_online

pytestmark = pytest.mark.django_db

CHANNEL = "test.{}!x"  # tests.devices.device_online's connection


def _beat(device: Device, *, at, paused: bool = False, channel: str) -> None:
    machine_heartbeat(
        machine_id=str(device.machine_id),
        heartbeat={
            "paused": paused,
            "devices": [
                {
                    "index": 0,
                    "temp_c": 50.0,
                    "vram_free_mb": 8000,
                    "loaded_models": [MODEL],
                    "slots": 1,
                }
            ],
        },
        now=at,
        channel_name=channel,
    )


def test_a_graceful_agent_restart_keeps_the_uptime(live_device, owner):
    """The bug: the agent's drain (heartbeats saying ``paused``) opened a new
    span over the open one, which stayed stored ending where it began; the
    page fell from 87 % online to 3.7 % after one Ctrl-C and restart."""
    start = timezone.now() - timedelta(hours=2)
    machine = live_device().machine
    OnlineSpan.objects.filter(machine=machine).delete()
    device = device_online(machine, now=start)
    Device.objects.filter(id=device.id).update(first_seen_at=start)
    old = CHANNEL.format(machine.id)
    # steady heartbeats write nothing; then Ctrl-C: the drain says paused
    stop = start + timedelta(hours=1, minutes=50)
    _beat(device, at=stop, paused=True, channel=old)
    machine_disconnect(
        machine_id=str(machine.id),
        channel_name=old,
        last_heartbeat_at=stop + timedelta(seconds=2),
    )
    back = stop + timedelta(seconds=12)
    new = f"test.{machine.id}!restarted"
    machine_hello(
        machine_id=str(machine.id),
        channel_name=new,
        hello={
            "agent_version": "test",
            "engine_name": "scripted",
            "engine_version": "1",
            "public_key": machine.public_key or "A" * 43 + "=",
            "accepts_serverless": True,
            "devices": [
                {"index": 0, "name": "NVIDIA GeForce RTX 4090", "vram_total_mb": 24576}
            ],
        },
        now=back,
    )
    _beat(device, at=back + timedelta(seconds=1), channel=new)
    spans = list(
        OnlineSpan.objects.filter(machine=machine).values_list("started_at", "ended_at")
    )
    assert spans == [(start, back + timedelta(seconds=1))], (
        "one span: a 13 s gap is within 30 s"
    )
    now = back + timedelta(seconds=5)  # live: its last heartbeat is fresh
    device = Device.objects.select_related("machine__lease").get(id=device.id)
    assert device_online_fraction(device=device, now=now) == Decimal(1)


def test_a_pause_while_online_does_not_cut_the_open_span(live_device):
    start = timezone.now() - timedelta(hours=1)
    machine = live_device().machine
    OnlineSpan.objects.filter(machine=machine).delete()
    device = device_online(machine, now=start)
    Device.objects.filter(id=device.id).update(first_seen_at=start)
    channel = CHANNEL.format(machine.id)
    _beat(device, at=start + timedelta(minutes=30), paused=True, channel=channel)
    _beat(device, at=start + timedelta(minutes=40), paused=False, channel=channel)
    assert OnlineSpan.objects.filter(machine=machine).count() == 1
    device = Device.objects.select_related("machine__lease").get(id=device.id)
    now = start + timedelta(minutes=40, seconds=5)
    assert device_online_fraction(device=device, now=now) == Decimal(1)
