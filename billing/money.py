"""Money units: every amount is an integer number of nano-USD (1 USD = 10**9).

Prices per token are fractions of a cent, so the ledger's minor unit is finer than
micro-USD; integers keep every sum exact (CONVENTIONS.md "Python": never floats).
"""

from __future__ import annotations

from decimal import ROUND_DOWN, Decimal

NANO_PER_USD = 10**9


def usd_to_nano(usd: Decimal | str | int) -> int:
    """Convert a USD amount (``Decimal``/str, e.g. ``"0.0000002"``) to nano-USD.

    Raises ValueError when the amount is not finite (NaN, infinity) or has more
    precision than 1 nano-USD.
    """
    value = Decimal(str(usd)) * NANO_PER_USD
    if not value.is_finite():
        raise ValueError(f"{usd} is not a finite USD amount")
    if value != value.to_integral_value():
        raise ValueError(f"{usd} USD is finer than 1 nano-USD")
    return int(value)


def nano_to_usd(nano: int) -> Decimal:
    """Convert nano-USD to an exact ``Decimal`` USD amount."""
    return Decimal(nano) / NANO_PER_USD


def nano_to_usd_str(nano: int) -> str:
    """Format nano-USD as a plain decimal USD string with no exponent, e.g. ``"0.00000120"``."""
    return format(nano_to_usd(nano).normalize(), "f") if nano else "0"


def share_of(amount_nano: int, fraction: Decimal) -> int:
    """Return ``fraction`` of ``amount_nano``, rounded down to a whole nano-USD."""
    return int((Decimal(amount_nano) * fraction).to_integral_value(rounding=ROUND_DOWN))
