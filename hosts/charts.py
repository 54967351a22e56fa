"""Tiny server-rendered SVG charts (no JavaScript, no CDN: the network is closed)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Chart:
    """Coordinates for an inline SVG of ``width`` × ``height`` px.

    ``points`` is the polyline's ``points`` attribute; ``bars`` is a list of
    (x, y, width, height, label, value) rectangles; ``ymax`` the value of the
    top line; ``axis`` a bar chart's ``Axis``.
    """

    width: int
    height: int
    points: str
    bars: list
    ymax: float
    empty: bool
    axis: object = None


def line_chart(
    samples: list[tuple[datetime, float]],
    *,
    start: datetime,
    end: datetime,
    ymax: float,
    width: int = 480,
    height: int = 120,
    left: int = 28,
) -> Chart:
    """A polyline of ``samples`` ((when, value), oldest first) placed by time
    between ``start`` and ``end``, ``ymax`` the top line, with axes
    (``Chart.axis``): y ticks at 0, half and ``ymax``; under the plot the
    times of ``time_marks`` (UTC: dates at midnights, else hours), none
    overlapping."""
    base = height - 16  # the x axis; day labels below it
    plot = base - 6
    ticks = [
        (round(base - plot * share, 1), f"{ymax * share:g}") for share in (0, 0.5, 1)
    ]
    span = max(1.0, (end - start).total_seconds())
    inner = width - left - 4

    def x_of(when: datetime) -> float:
        return left + inner * min(1.0, max(0.0, (when - start).total_seconds() / span))

    marks: list = []
    for at, text in time_marks(start, end):
        x = round(x_of(at), 1)
        # none cut at an edge (labels are centred), none overlapping
        if left + 14 <= x <= width - 22 and (not marks or x - marks[-1][0] >= 50):
            marks.append((x, text, "middle"))
    axis = Axis(left, ticks, marks)
    if not samples:
        return Chart(width, height, "", [], ymax, True, axis)
    pts = []
    for when, value in samples:
        y = base - (min(value, ymax) / ymax) * plot if ymax else base
        pts.append(f"{x_of(when):.1f},{y:.1f}")
    if len(pts) == 1:  # one sample: a level line to now
        pts.append(f"{x_of(end):.1f},{pts[0].split(',')[1]}")
    return Chart(width, height, " ".join(pts), [], ymax, False, axis)


def score_chart(
    samples: list[tuple[datetime, float]], *, now: datetime, window: timedelta
) -> tuple[Chart, datetime]:
    """A device's score samples (oldest first, at least one) as a
    ``line_chart`` from when it begins: ``window`` before ``now``, or for a
    device younger than that its first sample (an hour before ``now`` at the
    latest), so a young device's few hours are not a speck at the right edge.
    Returns (the chart, its start)."""
    start = max(now - window, min(samples[0][0], now - timedelta(hours=1)))
    return line_chart(samples, start=start, end=now, ymax=100), start


TIME_STEPS = [
    timedelta(minutes=m) for m in (15, 30, 60, 120, 180, 360, 720)
] + [timedelta(days=1)]


def time_marks(start: datetime, end: datetime, most: int = 8) -> list[tuple]:
    """(when, label) marks between ``start`` and ``end`` (UTC) at the finest
    step of ``TIME_STEPS`` giving at most ``most`` of them: midnights
    labelled ``%d %b``, other marks ``%H:%M``."""
    span = end - start
    step = next((s for s in TIME_STEPS if span / s <= most), None)
    if step is None:  # longer than ``most`` days: every few days
        step = timedelta(days=math.ceil(span / timedelta(days=most)))
    midnight = start.replace(hour=0, minute=0, second=0, microsecond=0)
    at = midnight + step * math.ceil((start - midnight) / step)
    marks = []
    while at <= end:
        daily = at.hour == at.minute == 0
        marks.append((at, at.strftime("%d %b") if daily else at.strftime("%H:%M")))
        at += step
    return marks


def nice_top(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10^k at or above ``value`` (> 0): a top
    line people read at a glance (``nice_top(41_000_000) == 50_000_000``)."""
    if value <= 0:
        return 0
    step = 10 ** math.floor(math.log10(value))
    for factor in (1, 2, 2.5, 5, 10):
        if value <= factor * step * (1 + 1e-12):
            return factor * step
    return 10 * step


@dataclass(frozen=True)
class Axis:
    """A bar chart's axes: ``ticks`` (y px, label) on the left of the plot,
    which starts at ``left`` px; ``days`` (x px, label, text-anchor) under it,
    the first and last always, none overlapping."""

    left: int
    ticks: list
    days: list


def bar_chart(
    items: list[tuple[str, float, str]],
    *,
    width: int = 480,
    height: int = 120,
    fmt=None,
    left: int = 56,
) -> Chart:
    """Bars of ``(label, value, shown value)`` under a top line at
    ``nice_top`` of the tallest, with axes (``Chart.axis``): y ticks at 0 and
    the top labelled by ``fmt(value)`` (``str`` by default) in a margin of
    ``left`` px, x labels every few bars. ``Chart.ymax`` is the top line's
    value."""
    fmt = fmt or (lambda value: f"{value:g}")
    peak = max((v for _, v, _ in items), default=0)
    top = nice_top(peak)
    base = height - 16  # the x axis; day labels below it
    plot = base - 4  # px from the axis to the top line
    if not items:
        return Chart(width, height, "", [], top, True, Axis(left, [], []))
    slot = (width - left) / len(items)
    bars = []
    for i, (label, value, shown) in enumerate(items):
        h = (value / top) * plot if top else 0
        bars.append(
            (
                round(left + i * slot + 1, 1),
                round(base - h, 1),
                round(max(1.0, slot - 2), 1),
                round(h, 1),
                label,
                shown,
            )
        )
    ticks = [(round(base - plot * share, 1), fmt(top * share)) for share in (0, 1)]
    if top:  # a middle line, unlabelled: its value may need a digit more
        ticks.insert(1, (round(base - plot / 2, 1), ""))
    else:
        ticks = ticks[:1]
    every = max(1, math.ceil(len(items) / max(1, (width - left) // 60)))
    days = [(round(left + 1, 1), items[0][0], "start")]
    for i in range(every, len(items) - 1, every):
        if (len(items) - 1 - i) * slot >= 50:
            days.append((round(left + (i + 0.5) * slot, 1), items[i][0], "middle"))
    if len(items) > 1:
        days.append((width - 1, items[-1][0], "end"))
    return Chart(width, height, "", bars, top, peak == 0, Axis(left, ticks, days))
