"""Money as people read it (the one place pages format USD).

The ledger counts integer nano-USD (``billing.money``). Pages show:

- an amount of a cent or more to the cent, half up, with thousands separators:
  ``$4.99``, ``-$1,250.00`` (the exact figure in the element's ``title`` when
  rounding changed it);
- a non-zero amount under a cent at the ledger's own precision, always nine
  decimals, and labelled as under a cent: ``$0.000000800 <1¢`` (nine decimals
  are exact: 1 nano-USD is the ledger's unit);
- zero as ``$0.00``;
- a per-token price per million tokens, as renters compare them: ``$0.20 / 1M
  tokens``.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from django import template
from django.utils.html import format_html

from billing.money import NANO_PER_USD

register = template.Library()

CENT_NANO = NANO_PER_USD // 100
SUBCENT_LABEL = "<1¢"
SUBCENT_TITLE = "under one cent: shown to nine decimals, the ledger's exact unit"


def _parts(nano: int) -> tuple[str, str, bool]:
    """(shown, exact, sub_cent) for an integer nano-USD amount."""
    sign = "-" if nano < 0 else ""
    usd = Decimal(abs(nano)) / NANO_PER_USD
    exact = f"{sign}${usd:,.9f}"
    if nano == 0:
        return "$0.00", exact, False
    if abs(nano) < CENT_NANO:
        return exact, exact, True
    cents = usd.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    return f"{sign}${cents:,.2f}", exact, False


def usd_text(nano: int | None) -> str:
    """Plain text of an amount (messages, chart tooltips): ``$4.99``,
    ``$0.000000800 (under 1¢)``; empty for None."""
    if nano is None or nano == "":
        return ""
    shown, _, sub_cent = _parts(int(nano))
    return f"{shown} (under 1¢)" if sub_cent else shown


@register.filter
def usd(nano: int | None) -> str:
    """An amount as HTML: ``<span class="usd">$4.99</span>``; a sub-cent amount
    carries its ``<1¢`` label; the exact figure is the title when rounded."""
    if nano is None or nano == "":
        return ""
    shown, exact, sub_cent = _parts(int(nano))
    if sub_cent:
        return format_html(
            '<span class="usd subcent" title="{}">{} <small>{}</small></span>',
            SUBCENT_TITLE,
            shown,
            SUBCENT_LABEL,
        )
    if exact.rstrip("0").rstrip(".") != shown.rstrip("0").rstrip(".") and nano:
        return format_html(
            '<span class="usd" title="{} exactly">{}</span>', exact, shown
        )
    return format_html('<span class="usd">{}</span>', shown)


# the billing pages' name for the same filter
register.filter("nano_usd", usd)


def per_million_text(nano_per_token: int) -> str:
    """A per-token price (nano-USD) per million tokens: ``$0.20 / 1M tokens``."""
    shown, _, _ = _parts(int(nano_per_token) * 1_000_000)
    return f"{shown} / 1M tokens"


@register.filter
def per_million(nano_per_token: int | None) -> str:
    """Filter form of ``per_million_text``; empty for None."""
    if nano_per_token is None or nano_per_token == "":
        return ""
    return per_million_text(nano_per_token)


@register.filter
def when(value) -> str:
    """A date and time as people read it, in UTC: ``1 Dec 2026, 23:02 UTC``, in a
    ``<time>`` whose ``datetime`` is the ISO form; empty for None."""
    if not value:
        return ""
    return format_html(
        '<time datetime="{}">{}</time>',
        value.isoformat(),
        f"{value.day} {value:%b %Y, %H:%M} UTC",
    )
