"""A device outcome's reason (``hosts.DeviceOutcome.reason``) in words, as
staff explain it to a host: what the device did, and what it cost it."""

from __future__ import annotations

from django.conf import settings

from hosts.models import DeviceOutcome


def _deadlines() -> dict[str, str]:
    claim = f"{settings.BALLAST_CLAIM_TIMEOUT_S:g}"
    first = f"{settings.BALLAST_FIRST_TOKEN_TIMEOUT_S:g}"
    stall = f"{settings.BALLAST_STALL_TIMEOUT_S:g}"
    return {
        "succeeded": "answered the job",
        "claim_timeout": f"did not claim the offer within {claim} s",
        "first_token_timeout": f"sent no first token within {first} s of its claim",
        "host_error": "its agent answered with an error",
        "died_midstream": "its stream died after output (the job continued"
        " on another device)",
        "stalled": f"its stream went silent for over {stall} s after output",
        "spot_check": "passed a spot check",
        "spot_check_failed": "failed a check of its honesty (its held earnings"
        " were reversed)",
        "verified": "scored another device's answer as a verifier",
        "verifier_check_passed": "judged a check of its verifying as the"
        " reference model does",
        "verify_refused": "refused or failed a verification it was sent",
        "verify_expired": "did not answer a verification in time",
        "verify_outvoted": "its verdict on an answer was outvoted by two verifiers",
    }


def outcome_words(outcome: DeviceOutcome) -> str:
    """``outcome``'s reason in words, then its stored finding when it has one:
    ``failed a check of its honesty (…): spot check 12: expected answer
    missing``. An unknown reason code is shown as it is."""
    said = _deadlines().get(outcome.reason) or outcome.reason or outcome.source
    return f"{said}: {outcome.detail}" if outcome.detail else said
