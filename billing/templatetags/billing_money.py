"""Money as people read it (the one place pages format USD).

The ledger counts integer nano-USD (``billing.money``). Pages show:

- an amount of a cent or more to the cent, half up, with thousands separators:
  ``$4.99``, ``-$1,250.00`` (the exact figure in the element's ``title`` when
  rounding changed it);
- a non-zero amount under a cent to ``SUBCENT_DIGITS`` significant digits,
  half up, without trailing zeros, as people write it: ``$0.0000034``,
  ``$0.00226`` (the exact figure, nine decimals at most, in the ``title``);
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
SUBCENT_DIGITS = 3  # significant digits of an amount under a cent


def _plain(usd: Decimal) -> str:
    """A non-negative Decimal as fixed-point text without trailing zeros."""
    text = f"{usd:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _parts(nano: int) -> tuple[str, str | None]:
    """(shown, exact) for an integer nano-USD amount: ``shown`` as people write
    it (module docstring); ``exact``, to the nano-USD without trailing zeros,
    only when ``shown`` is rounded (else None)."""
    sign = "-" if nano < 0 else ""
    usd = Decimal(abs(nano)) / NANO_PER_USD
    if nano == 0:
        return "$0.00", None
    if abs(nano) < CENT_NANO:
        # the place of the last significant digit kept: 10**(adjusted - digits + 1)
        step = Decimal(1).scaleb(usd.adjusted() - SUBCENT_DIGITS + 1)
        shown = usd.quantize(step, rounding=ROUND_HALF_UP)
        text = f"{sign}${_plain(shown)}"
    else:
        shown = usd.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
        text = f"{sign}${shown:,.2f}"
    return text, (f"{sign}${_plain(usd)}" if shown != usd else None)


def usd_text(nano: int | None) -> str:
    """Plain text of an amount (messages, chart tooltips, the admin): ``$4.99``,
    ``-$1,250.00``, ``$0.0000034``; empty for None. Raises ValueError (or
    TypeError) for what is not an integer amount."""
    if nano is None or nano == "":
        return ""
    return _parts(int(nano))[0]


@register.filter
def usd(nano: int | None) -> str:
    """An amount as HTML: ``<span class="usd">$4.99</span>``, the exact figure
    its ``title`` when the shown one is rounded; empty for None."""
    if nano is None or nano == "":
        return ""
    shown, exact = _parts(int(nano))
    if exact:
        return format_html(
            '<span class="usd" title="{} exactly">{}</span>', exact, shown
        )
    return format_html('<span class="usd">{}</span>', shown)


# the billing pages' name for the same filter
register.filter("nano_usd", usd)


def per_million_text(nano_per_token: int) -> str:
    """A per-token price (nano-USD) per million tokens: ``$0.20 / 1M tokens``."""
    return f"{usd_text(int(nano_per_token) * 1_000_000)} / 1M tokens"


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
