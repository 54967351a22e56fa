"""The reliability score formula (DESIGN.md "Reliability score"), as pure functions.

Reproduces ``shared/vectors/score.json``; ``hosts.services.device_score_inputs``
reads its inputs from the database.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

WINDOW = 50
PRIOR = Decimal(60)


def score_parts(
    *,
    outcomes: int,
    successes: int,
    online_fraction: Decimal | float,
    model_median_ttft_ms: float | None,
    device_ttft_ms: float | None,
) -> tuple[Decimal, Decimal, Decimal]:
    """Return the score's three parts: (success of 70, uptime of 20, latency of 10).

    ``outcomes``/``successes`` count the device's last 50 outcomes (success is 0
    with none); ``online_fraction`` is 0..1 of the last 24 h (or since first
    seen); TTFTs are medians in ms over the last hour: latency is 10 × min(1,
    model's ÷ device's), 10 when either is unknown. Raises ValueError when
    ``successes`` is not within 0..``outcomes``.
    """
    if outcomes < 0 or successes < 0 or successes > outcomes:
        raise ValueError("successes must be within 0..outcomes")
    rate = Decimal(successes) / Decimal(outcomes) if outcomes else Decimal(0)
    success = 70 * rate
    uptime = 20 * Decimal(str(online_fraction))
    if device_ttft_ms is None or not model_median_ttft_ms or device_ttft_ms <= 0:
        latency = Decimal(10)
    else:
        ratio = Decimal(str(model_median_ttft_ms)) / Decimal(str(device_ttft_ms))
        latency = 10 * min(Decimal(1), ratio)
    return success, uptime, latency


def score_unrounded(
    *,
    outcomes: int,
    successes: int,
    online_fraction: Decimal | float,
    model_median_ttft_ms: float | None,
    device_ttft_ms: float | None,
) -> Decimal:
    """Return the exact score before rounding, 0..100 (arguments of ``score_parts``).

    The sum of the parts; with n < 50 outcomes, (n/50) × that + (1 − n/50) × 60,
    and 60 with none. Raises ValueError as ``score_parts`` does.
    """
    parts = score_parts(
        outcomes=outcomes,
        successes=successes,
        online_fraction=online_fraction,
        model_median_ttft_ms=model_median_ttft_ms,
        device_ttft_ms=device_ttft_ms,
    )
    n = min(outcomes, WINDOW)
    if n == 0:
        return PRIOR
    computed = sum(parts, Decimal(0))
    if n >= WINDOW:
        return computed
    weight = Decimal(n) / WINDOW
    return weight * computed + (1 - weight) * PRIOR


def score_round(value: Decimal) -> int:
    """Round half up to an integer (48.5 → 49)."""
    return int(value.quantize(Decimal(1), rounding=ROUND_HALF_UP))


QUARANTINE_WINDOW = 20
QUARANTINE_FAILED_CHECKS = 3
QUARANTINE_SCORE_BELOW = 50
RELEASE_PASSES_IN_A_ROW = 3
RELEASE_PASSES_NEW_DEVICE = 1  # a device new to its machine: one check before work


def quarantine_after_failure(*, score: int, recent_checks: list[bool]) -> bool:
    """True when a recorded failure must quarantine the device.

    DESIGN.md "Spot checks": score under 50, or 3 failed spot checks among the
    device's last 20 (``recent_checks``: passed flags, newest first).
    """
    failed = sum(1 for passed in recent_checks[:QUARANTINE_WINDOW] if not passed)
    return score < QUARANTINE_SCORE_BELOW or failed >= QUARANTINE_FAILED_CHECKS


def quarantine_release(
    *, recent_checks: list[bool], passes: int = RELEASE_PASSES_IN_A_ROW
) -> bool:
    """True when a quarantined device has passed its last ``passes`` spot checks
    in a row (3; 1 for a device new to its machine, ``Device.quarantine_passes_needed``).
    ``recent_checks``: passed flags, newest first."""
    last = recent_checks[:passes]
    return len(last) == passes and all(last)
