"""The deadlines of an attempt (DESIGN.md "When a host fails"): 5 s to claim
after the offer, 20 s to the first token after the claim, and a stall window of
10 s between tokens once output has begun (``BALLAST_CLAIM_TIMEOUT_S``,
``BALLAST_FIRST_TOKEN_TIMEOUT_S``, ``BALLAST_STALL_TIMEOUT_S``).

The job's coroutine waits on them with asyncio timers (``stage_timeout_s``);
the database keeps the claim and first-token deadlines on the attempt for staff
and for the reaper.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from ..models import Attempt

# what an attempt waits for, and the outcome of missing it
CLAIM = "claim"
FIRST_TOKEN = "first_token"
NEXT_TOKEN = "next_token"

TIMEOUT_OUTCOMES = {
    CLAIM: Attempt.Outcome.CLAIM_TIMEOUT,
    FIRST_TOKEN: Attempt.Outcome.FIRST_TOKEN_TIMEOUT,
    NEXT_TOKEN: Attempt.Outcome.STALLED,
}


def stage_timeout_s(stage: str) -> float:
    """Seconds an attempt may wait at ``stage`` (``CLAIM``: from the offer;
    ``FIRST_TOKEN``: from the claim; ``NEXT_TOKEN``: from the last token)."""
    return {
        CLAIM: settings.BALLAST_CLAIM_TIMEOUT_S,
        FIRST_TOKEN: settings.BALLAST_FIRST_TOKEN_TIMEOUT_S,
        NEXT_TOKEN: settings.BALLAST_STALL_TIMEOUT_S,
    }[stage]


def claim_deadline(offered_at: datetime) -> datetime:
    """When an attempt offered at ``offered_at`` must have been claimed."""
    return offered_at + timedelta(seconds=stage_timeout_s(CLAIM))


def first_token_deadline(claimed_at: datetime) -> datetime:
    """When an attempt claimed at ``claimed_at`` must have sent its first token."""
    return claimed_at + timedelta(seconds=stage_timeout_s(FIRST_TOKEN))
