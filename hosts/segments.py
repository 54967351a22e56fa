"""Why a segment (one attempt on a host's device) earned nothing, in words for its
host, from what is stored: the attempt's outcome and output, its receipt's
verdict, its token count, its earning (DESIGN.md "Money", "When a host fails").

A host's page never says which of its jobs were spot checks (DESIGN.md "Spot
checks": nothing afterwards tells a check from a job), so nothing here reads it.
"""

from __future__ import annotations

from billing.models import Earning
from billing.services import segment_of

# an attempt that ended before any of its output reached the renter
BEFORE_OUTPUT = {
    "claim_timeout": "the agent did not claim the job in time",
    "first_token_timeout": "no first token in time after the claim",
    "host_error": "the agent answered with an error before any output",
    "empty_answer": "the answer was empty",
    "stalled": "the stream stalled before any output",
    "died_midstream": "the connection was lost before any output",
    "cancelled": "cancelled before any output (the renter left, or the job ended)",
}
# an attempt whose stream died after output: no receipt, no pay (DESIGN.md "Money")
DIED = "the stream died mid-answer, so no receipt came: a died segment is not paid"


def segment_earned_nothing(attempt) -> str | None:
    """Why ``attempt`` (a ``jobs.Attempt`` with its job, device and machine,
    earning and receipt check loaded) earned nothing, or None when it earned
    (its earning is held or released) or has not ended yet.

    In order: a reversed earning; no output (by outcome); a died or stalled
    stream after output; a non-streamed answer whose renter left (no tokens
    billed); the receipt and token count (``billing.services.Segment.
    unpaid_reason``); a job not charged.
    """
    try:
        earning = attempt.earning
    except Earning.DoesNotExist:
        earning = None
    if earning is not None:
        if earning.status == Earning.Status.REVERSED:
            return (
                "reversed: a check of this device failed while the earning was held"
            )
        return None
    if attempt.state != attempt.State.ENDED:
        return None
    if attempt.output_chars == 0:
        return BEFORE_OUTPUT.get(attempt.outcome, "no output reached the renter")
    if attempt.outcome in (attempt.Outcome.DIED_MIDSTREAM, attempt.Outcome.STALLED):
        return DIED
    if attempt.tokens_billed == 0:
        return (
            "the renter left before the answer was delivered (not streamed):"
            " nothing received, nothing billed"
        )
    reason = segment_of(attempt).unpaid_reason
    if reason is not None:
        return reason
    if attempt.job.cost_nano == 0:
        return "nothing was charged for this job"
    return "not paid yet: the job's charge is still being posted"
