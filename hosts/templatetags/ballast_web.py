"""Template filters of the web pages: money and units."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from django import template

from billing.money import nano_to_usd_str

register = template.Library()


@register.filter
def usd(nano: int | None) -> str:
    """Format integer nano-USD exactly as dollars: ``$0.00000192``, ``-$1.5``, ``$0``."""
    if nano is None or nano == "":
        return ""
    nano = int(nano)
    sign = "-" if nano < 0 else ""
    return f"{sign}${nano_to_usd_str(abs(nano))}"


@register.filter
def dec1(value) -> str:
    """A Decimal/float with one decimal place (``12.3``); empty for None."""
    if value is None:
        return ""
    return f"{Decimal(str(value)).quantize(Decimal('0.1'), rounding=ROUND_HALF_UP)}"
