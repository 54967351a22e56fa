"""Template filters of the web pages: money and units."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from django import template

from billing.templatetags.billing_money import per_million, usd, when

register = template.Library()

# money and dates as the billing pages show them (one formatting rule)
register.filter("usd", usd)
register.filter("per_million", per_million)
register.filter("when", when)


@register.filter
def dec1(value) -> str:
    """A Decimal/float with one decimal place (``12.3``); empty for None."""
    if value is None:
        return ""
    return f"{Decimal(str(value)).quantize(Decimal('0.1'), rounding=ROUND_HALF_UP)}"


@register.filter
def percent(value) -> str:
    """A fraction (0..1) as a percentage with one decimal, ``97.3 %``; 100 % and
    0 % only when exact (99.96 % reads ``99.9 %``, not ``100 %``); empty for None."""
    if value is None:
        return ""
    pct = Decimal(str(value)) * 100
    shown = pct.quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)
    if shown == 100 and pct < 100:
        shown = Decimal("99.9")
    elif shown == 0 and pct > 0:
        shown = Decimal("0.1")
    return f"{shown.normalize():f} %" if shown in (0, 100) else f"{shown} %"


@register.filter
def duration(seconds) -> str:
    """Seconds as a person reads a length of time: ``2 h 05 min``, ``12 min``,
    ``40 s``; empty for None."""
    if seconds is None:
        return ""
    total = int(round(float(seconds)))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min"
    return f"{secs} s"


@register.filter
def thousands(value) -> str:
    """A whole number with thousands separators: ``2,048``; empty for None."""
    if value is None or value == "":
        return ""
    return f"{int(value):,}"
