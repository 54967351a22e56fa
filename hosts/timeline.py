"""A machine's online/offline timeline per day, for its page (read only).

Drawn from the stored ``OnlineSpan`` rows, the same stretches the uptime part of
the score counts (``hosts.services.spans_online``): nothing is written per
heartbeat. Days are UTC calendar days; times are timezone-aware UTC.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone

from .models import Machine
from .services import machine_spans, spans_online

DAY = timedelta(days=1)
MINUTES = 1440  # a day's bar is drawn in minutes: x from 0 to 1440


@dataclass
class Stretch:
    """Part of a day's bar: ``state`` ``on``, ``off``, ``none`` (before the
    machine was registered) or ``later`` (after now), from ``start`` to ``end``
    (UTC), at ``x`` minutes past midnight for ``width`` minutes."""

    state: str
    start: datetime
    end: datetime
    x: float
    width: float

    @property
    def title(self) -> str:
        """What the stretch was, in words: ``online 07:12–12:05 UTC``."""
        words = {
            "on": "online",
            "off": "offline",
            "none": "not registered yet",
            "later": "to come",
        }
        end = "24:00" if self.end.time() == time(0) else f"{self.end:%H:%M}"
        return f"{words[self.state]} {self.start:%H:%M}–{end} UTC"


@dataclass
class DayUptime:
    """One UTC day: seconds counted (``known_s``: registered and not in the
    future) and online among them, and the stretches of its bar, in order."""

    day: date
    known_s: float = 0.0
    online_s: float = 0.0
    stretches: list[Stretch] = field(default_factory=list)

    @property
    def share(self) -> float | None:
        """The online fraction (0..1) of the counted time, None when none counted."""
        return self.online_s / self.known_s if self.known_s else None

    @property
    def offline_s(self) -> float:
        return self.known_s - self.online_s


def day_uptimes(
    *,
    since: datetime,
    stretches_online: list[tuple[datetime, datetime]],
    now: datetime,
    days: int,
) -> list[DayUptime]:
    """The last ``days`` UTC days up to ``now`` (oldest first), from the
    machine's online stretches (pure).

    ``since``: when the machine was registered (before it: ``none``; after
    ``now``: ``later``); ``stretches_online``: (start, end) pairs, any order,
    overlaps allowed.
    """
    merged: list[list[datetime]] = []
    for start, end in sorted(stretches_online):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    first = now.astimezone(timezone.utc).date() - timedelta(days=days - 1)
    result = []
    for i in range(days):
        day = first + timedelta(days=i)
        day_start = datetime.combine(day, time(0), tzinfo=timezone.utc)
        day_end = day_start + DAY
        known_start = min(max(day_start, since), day_end)
        known_end = max(min(day_end, now), known_start)
        uptime = DayUptime(day=day, known_s=(known_end - known_start).total_seconds())

        def add(state: str, start: datetime, end: datetime) -> None:
            if end > start:
                uptime.stretches.append(
                    Stretch(
                        state=state,
                        start=start,
                        end=end,
                        x=round((start - day_start).total_seconds() / 60, 2),
                        width=round((end - start).total_seconds() / 60, 2),
                    )
                )

        add("none", day_start, known_start)
        cursor = known_start
        for start, end in merged:
            start, end = max(start, known_start), min(end, known_end)
            if end <= start:
                continue
            add("off", cursor, start)
            add("on", start, end)
            uptime.online_s += (end - start).total_seconds()
            cursor = end
        add("off", cursor, known_end)
        add("none" if known_end <= since else "later", known_end, day_end)
        result.append(uptime)
    return result


def machine_timeline(
    *, machine: Machine, now: datetime, days: int = 14
) -> list[DayUptime]:
    """The machine's last ``days`` UTC days, oldest first, from the day it was
    registered if that is later (one or two queries; reads ``machine.lease``:
    select_related it)."""
    registered = machine.created_at.astimezone(timezone.utc).date()
    today = now.astimezone(timezone.utc).date()
    days = max(1, min(days, (today - registered).days + 1))
    start = datetime.combine(
        now.astimezone(timezone.utc).date() - timedelta(days=days - 1),
        time(0),
        tzinfo=timezone.utc,
    )
    spans, latest = machine_spans(machine_id=machine.id, start=start)
    return day_uptimes(
        since=machine.created_at,
        stretches_online=spans_online(
            machine=machine, spans=spans, latest=latest, now=now
        ),
        now=now,
        days=days,
    )


def timeline_share(days: list[DayUptime]) -> float | None:
    """The online fraction (0..1) over all of ``days``' counted time, or None."""
    known = sum(d.known_s for d in days)
    return sum(d.online_s for d in days) / known if known else None
