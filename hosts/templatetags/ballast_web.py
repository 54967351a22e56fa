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
