"""How likely a device's answer is verified (DESIGN.md "Verifying real
answers": ``BALLAST_VERIFY_RATE``, higher for a device's first jobs and after a
failed check, decaying as checks pass), and the draw a host cannot predict."""

from __future__ import annotations

import secrets

from django.conf import settings

from hosts.models import Device, DeviceOutcome
from hosts.services import machine_suspected_since
from jobs.models import Attempt, Verification

# the draw's resolution: a uniform number in [0, 1) from 53 random bits
_BITS = 53
# past this many of its new-job spans (BALLAST_VERIFY_NEW_JOBS) a device's
# real jobs are not counted further: the new-device part is below 0.1 % by then
_NEW_SPANS_COUNTED = 10
EXEMPT_WINDOW = 50
"""A device's latest answers whose exemptions ``exempt_multiplier`` counts."""


def verification_draw() -> float:
    """A uniform number in [0, 1) from ``secrets`` (the operating system's
    randomness: nothing a host can read or replay tells the next draw)."""
    return secrets.randbits(_BITS) / (1 << _BITS)


def verification_rate(*, device_id: int) -> float:
    """The chance (0..1) that an answer of device ``device_id`` is verified:
    the largest of

    - the base, ``BALLAST_VERIFY_RATE``;
    - the new-device rate ``BALLAST_VERIFY_NEW_RATE`` over its first
      ``BALLAST_VERIFY_NEW_JOBS`` real jobs (succeeded attempts of renters'
      jobs), then halving every ``BALLAST_VERIFY_NEW_JOBS`` jobs more;
    - suspicion after its machine's last failed check, whichever device of
      the machine failed it (a failed spot check, a confirmed implausible
      answer, an inflated count: ``services.device_check_failed``), or since
      the first hello of a new machine of an owner with a quarantined device
      (``hosts.services.machine_suspected_since``):
      ``BALLAST_VERIFY_SUSPECT_RATE`` halving every
      ``BALLAST_VERIFY_SUSPECT_PASSES`` checks this device passed since (spot
      checks passed, answers found plausible by a trusted verifier,
      ``checks.trusted``): a renamed device starts suspected;

    times ``exempt_multiplier`` (a device whose answers keep leaving
    something out of verification is verified more).

    Reads the database (at most six indexed queries)."""
    multiplier = exempt_multiplier(device_id=device_id)
    return min(1.0, multiplier * max(part(device_id) for part in _PARTS))


def verification_due(*, device_id: int, draw: float) -> bool:
    """Whether ``draw`` (``verification_draw``) verifies an answer of device
    ``device_id``: ``draw < verification_rate(device_id=...)``, with the
    exempt multiplier read first (one query) and each part of the rate read
    only when the draw is under its ceiling times that multiplier (most
    answers cost one query, none more than the rate's)."""
    multiplier = exempt_multiplier(device_id=device_id)
    ceilings = (
        settings.BALLAST_VERIFY_RATE,
        settings.BALLAST_VERIFY_NEW_RATE,
        settings.BALLAST_VERIFY_SUSPECT_RATE,
    )
    return any(
        draw < ceiling * multiplier and draw < part(device_id) * multiplier
        for ceiling, part in zip(ceilings, _PARTS)
    )


def exempt_multiplier(*, device_id: int) -> float:
    """How many times more often than its rate's parts say an answer of
    device ``device_id`` is verified (>= 1): its share of answers that left
    something out of verification (``Attempt.exemption``: a stop sequence's
    cut last token, bytes that are no character; ``exemptions``) among its
    last ``EXEMPT_WINDOW`` fresh succeeded attempts of renters' jobs (fewer
    count as that many, the rest whole), over the share
    ``BALLAST_VERIFY_EXEMPT_SHARE`` an honest device's traffic shows; 1 at or
    under it. A host that makes its answers look cut is verified the more
    the more it does. One indexed query."""
    exempt = sum(
        1
        for exemption in Attempt.objects.filter(
            device_id=device_id,
            kind=Attempt.Kind.FRESH,
            outcome=Attempt.Outcome.SUCCEEDED,
            job__is_spot_check=False,
        )
        .order_by("-ended_at")
        .values_list("exemption", flat=True)[:EXEMPT_WINDOW]
        if exemption
    )
    share = exempt / EXEMPT_WINDOW
    return max(1.0, share / settings.BALLAST_VERIFY_EXEMPT_SHARE)


def _base_rate(device_id: int) -> float:
    return settings.BALLAST_VERIFY_RATE


def _new_rate(device_id: int) -> float:
    span = settings.BALLAST_VERIFY_NEW_JOBS
    if span <= 0:
        return 0.0
    jobs = (
        Attempt.objects.filter(
            device_id=device_id,
            state=Attempt.State.ENDED,
            outcome=Attempt.Outcome.SUCCEEDED,
            job__is_spot_check=False,
        )
        .values("id")[: span * _NEW_SPANS_COUNTED]
        .count()
    )
    if jobs <= span:
        return settings.BALLAST_VERIFY_NEW_RATE
    return settings.BALLAST_VERIFY_NEW_RATE * 0.5 ** ((jobs - span) / span)


def _suspect_rate(device_id: int) -> float:
    failed_at = machine_suspected_since(
        machine_id=Device.objects.values_list("machine_id", flat=True).get(id=device_id)
    )
    if failed_at is None:
        return 0.0
    passes = DeviceOutcome.objects.filter(
        device_id=device_id,
        source=DeviceOutcome.Source.SPOT_CHECK,
        success=True,
        created_at__gt=failed_at,
    ).count()
    passes += Verification.objects.filter(
        device_id=device_id,
        verdict__in=(Verification.Verdict.PLAUSIBLE, Verification.Verdict.CLEARED),
        verifier_trusted=True,  # an unchecked verifier's word lowers nothing
        scored_at__gt=failed_at,
    ).count()
    return settings.BALLAST_VERIFY_SUSPECT_RATE * 0.5 ** (
        passes / settings.BALLAST_VERIFY_SUSPECT_PASSES
    )


# the parts of the rate, in the order of their settings (``verification_due``)
_PARTS = (_base_rate, _new_rate, _suspect_rate)
