"""Tiny server-rendered SVG charts (no JavaScript, no CDN: the network is closed)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chart:
    """Coordinates for an inline SVG of ``width`` × ``height`` px.

    ``points`` is the polyline's ``points`` attribute; ``bars`` is a list of
    (x, y, width, height, label, value) rectangles; ``ymax`` the value of the top line.
    """

    width: int
    height: int
    points: str
    bars: list
    ymax: float
    empty: bool


def line_chart(
    values: list[float], *, ymax: float, width: int = 480, height: int = 120
) -> Chart:
    """A polyline of ``values`` (oldest first) scaled so ``ymax`` is the top edge."""
    if not values:
        return Chart(width, height, "", [], ymax, True)
    pad = 4
    step = (width - 2 * pad) / max(1, len(values) - 1)
    pts = []
    for i, value in enumerate(values):
        x = pad + i * step
        y = (
            height - pad - (min(value, ymax) / ymax) * (height - 2 * pad)
            if ymax
            else height - pad
        )
        pts.append(f"{x:.1f},{y:.1f}")
    if len(pts) == 1:
        pts.append(f"{width - pad:.1f},{pts[0].split(',')[1]}")
    return Chart(width, height, " ".join(pts), [], ymax, False)


def bar_chart(
    items: list[tuple[str, float, str]], *, width: int = 480, height: int = 120
) -> Chart:
    """Bars of ``(label, value, shown value)``; the tallest bar fills the height."""
    top = max((v for _, v, _ in items), default=0)
    if not items:
        return Chart(width, height, "", [], top, True)
    slot = width / len(items)
    bars = []
    for i, (label, value, shown) in enumerate(items):
        h = (value / top) * (height - 16) if top else 0
        bars.append(
            (
                round(i * slot + 2, 1),
                round(height - 14 - h, 1),
                round(slot - 4, 1),
                round(h, 1),
                label,
                shown,
            )
        )
    return Chart(width, height, "", bars, top, top == 0)
