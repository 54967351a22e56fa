"""The online/offline timeline of a machine's page (issue 24 item 5): per UTC day,
the stretches online and offline from the stored online spans (the same ones the
score's uptime counts), nothing written per heartbeat."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hosts.models import Machine, OnlineSpan
from hosts.services import device_online_fraction, machine_register
from hosts.timeline import day_uptimes, machine_timeline, timeline_share
from tests.devices import device_online

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 10, tzinfo=UTC)


def at(day: int, hour: float) -> datetime:
    return T0 + timedelta(days=day, hours=hour)


def test_a_day_is_cut_into_online_offline_and_not_registered_stretches():
    days = day_uptimes(
        since=at(0, 6),
        stretches_online=[(at(0, 8), at(0, 12)), (at(0, 11), at(0, 13))],
        now=at(1, 12),
        days=2,
    )
    first, second = days
    assert [(s.state, s.x, s.width) for s in first.stretches] == [
        ("none", 0, 360),
        ("off", 360, 120),
        ("on", 480, 300),  # the overlapping stretches merged: 08:00–13:00
        ("off", 780, 660),
    ]
    assert first.known_s == 18 * 3600 and first.online_s == 5 * 3600
    assert first.share == pytest.approx(5 / 18)
    assert first.stretches[2].title == "online 08:00–13:00 UTC"
    assert first.stretches[3].title == "offline 13:00–24:00 UTC"
    assert [(s.state, s.width) for s in second.stretches] == [
        ("off", 720),
        ("later", 720),  # after now
    ]
    assert second.share == 0
    assert timeline_share(days) == pytest.approx(5 / 30)


def test_a_stretch_across_midnight_counts_on_both_days():
    days = day_uptimes(
        since=at(-5, 0),
        stretches_online=[(at(0, 22), at(1, 2))],
        now=at(1, 23),
        days=2,
    )
    assert days[0].online_s == 2 * 3600 and days[1].online_s == 2 * 3600
    assert days[0].stretches[-1].state == "on" and days[0].stretches[-1].width == 120
    assert days[1].stretches[0].state == "on" and days[1].stretches[0].x == 0


def test_a_day_before_registration_has_no_share():
    days = day_uptimes(since=at(1, 0), stretches_online=[], now=at(1, 6), days=2)
    assert days[0].share is None and days[0].stretches[0].state == "none"
    assert days[1].share == 0


def test_the_machine_timeline_agrees_with_the_score_s_uptime(owner, catalog):
    """The last 24 h online by the timeline equals the uptime part's fraction
    (one rule: ``hosts.services.spans_online``), including the open span of a
    machine live now."""
    now = datetime.now(UTC).replace(microsecond=0)
    machine, _ = machine_register(owner=owner, name="rig")
    Machine.objects.filter(id=machine.id).update(created_at=now - timedelta(days=3))
    device = device_online(machine, now=now - timedelta(seconds=20))  # live now
    device.first_seen_at = now - timedelta(days=3)
    device.save(update_fields=["first_seen_at"])
    OnlineSpan.objects.create(
        machine=machine,
        started_at=now - timedelta(hours=30),
        ended_at=now - timedelta(hours=20),
    )
    machine = Machine.objects.select_related("lease").get(id=machine.id)
    days = machine_timeline(machine=machine, now=now, days=3)
    assert len(days) == 3 and days[-1].day == now.date()
    window_start = now - timedelta(hours=24)
    online_24h = sum(
        (min(s.end, now) - max(s.start, window_start)).total_seconds()
        for d in days
        for s in d.stretches
        if s.state == "on" and s.end > window_start
    )
    fraction = device_online_fraction(device=device, now=now)
    assert float(fraction) == pytest.approx(online_24h / 86400, abs=1e-5)
    # 4 h of the old span in the window, and the open span's 20 s up to now
    assert online_24h == pytest.approx(4 * 3600 + 20, abs=1)
