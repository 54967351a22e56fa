"""How likely a device's answer is verified (DESIGN.md "Verifying real
answers": ``BALLAST_VERIFY_RATE``, higher for a device's first jobs and after a
failed check, decaying as checks pass), and the draw a host cannot predict."""

from __future__ import annotations

import secrets
from typing import NamedTuple

from django.conf import settings
from django.db import connection

from hosts.models import DeviceOutcome
from hosts.services import suspected_since_sql
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

    Reads the database (two fixed statements: ``_counts``, ``_suspect_rate``)."""
    counts = _counts(device_id)
    multiplier = _multiplier(counts)
    return min(1.0, multiplier * max(part(counts) for part in _PARTS))


def verification_due(*, device_id: int, draw: float) -> bool:
    """Whether ``draw`` (``verification_draw``) verifies an answer of device
    ``device_id``: ``draw < verification_rate(device_id=...)``, with the
    device's counts read first (one statement: its exempt answers for the
    exempt multiplier, its real jobs for the new-device part) and the
    suspicion part read only when the draw is under its ceiling times that
    multiplier and no part before it verified (most answers cost one
    statement, none more than two)."""
    counts = _counts(device_id)
    multiplier = _multiplier(counts)
    ceilings = (
        settings.BALLAST_VERIFY_RATE,
        settings.BALLAST_VERIFY_NEW_RATE,
        settings.BALLAST_VERIFY_SUSPECT_RATE,
    )
    return any(
        draw < ceiling * multiplier and draw < part(counts) * multiplier
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
    the more it does. One fixed statement (``_counts``)."""
    return _multiplier(_counts(device_id))


class _Counts(NamedTuple):
    """What one statement reads of device ``device_id`` for its rate
    (``_counts``): ``exempt`` answers among its last ``EXEMPT_WINDOW``
    (``exempt_multiplier``), ``jobs`` real jobs it served, counted up to
    ``_NEW_SPANS_COUNTED`` new-job spans (``_new_rate``)."""

    device_id: int
    exempt: int
    jobs: int


# a device's exempt answers among its latest fresh succeeded attempts of
# renters' jobs, and its succeeded attempts of renters' jobs up to a bound
# (``_counts``; the index ``attempt_device_ended``, then ``(device, state)``)
_COUNTS_SQL = (
    "SELECT"
    " (SELECT COUNT(*) FROM (SELECT a.exemption FROM jobs_attempt a"
    " JOIN jobs_job j ON j.id = a.job_id"
    " WHERE a.device_id = %s AND NOT j.is_spot_check AND a.kind = %s"
    " AND a.outcome = %s ORDER BY a.ended_at DESC LIMIT %s) w"
    " WHERE w.exemption <> ''),"
    " (SELECT COUNT(*) FROM (SELECT a.id FROM jobs_attempt a"
    " JOIN jobs_job j ON j.id = a.job_id"
    " WHERE a.device_id = %s AND NOT j.is_spot_check AND a.outcome = %s"
    " AND a.state = %s LIMIT %s) n)"
)


def _counts(device_id: int) -> _Counts:
    """Device ``device_id``'s ``_Counts``: one fixed statement."""
    span = max(0, settings.BALLAST_VERIFY_NEW_JOBS)
    succeeded = Attempt.Outcome.SUCCEEDED.value
    with connection.cursor() as cursor:
        cursor.execute(
            _COUNTS_SQL,
            [
                device_id, Attempt.Kind.FRESH.value, succeeded, EXEMPT_WINDOW,
                device_id, succeeded, Attempt.State.ENDED.value,
                span * _NEW_SPANS_COUNTED,
            ],
        )  # fmt: skip
        exempt, jobs = cursor.fetchone()
    return _Counts(device_id, exempt, jobs)


def _multiplier(counts: _Counts) -> float:
    """``exempt_multiplier`` of the device of ``counts``."""
    share = counts.exempt / EXEMPT_WINDOW
    return max(1.0, share / settings.BALLAST_VERIFY_EXEMPT_SHARE)


def _base_rate(counts: _Counts) -> float:
    return settings.BALLAST_VERIFY_RATE


def _new_rate(counts: _Counts) -> float:
    span = settings.BALLAST_VERIFY_NEW_JOBS
    if span <= 0:
        return 0.0
    if counts.jobs <= span:
        return settings.BALLAST_VERIFY_NEW_RATE
    return settings.BALLAST_VERIFY_NEW_RATE * 0.5 ** ((counts.jobs - span) / span)


def _suspect_rate(counts: _Counts) -> float:
    """The suspicion part: when the device's machine became suspected
    (``hosts.services.suspected_since_sql``, the rule of
    ``machine_suspected_since``) and the checks the device passed since
    (spot checks passed; answers found plausible or cleared by a trusted
    verifier: an unchecked verifier's word lowers nothing), in one fixed
    statement."""
    since, since_params = suspected_since_sql("d.machine_id")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT s.since,"
            " (SELECT COUNT(*) FROM hosts_deviceoutcome o WHERE o.device_id = s.id"
            " AND o.source = %s AND o.success AND o.created_at > s.since)"
            " + (SELECT COUNT(*) FROM jobs_verification v WHERE v.device_id = s.id"
            " AND v.verdict IN (%s, %s) AND v.verifier_trusted"
            " AND v.scored_at > s.since)"
            f" FROM (SELECT d.id, {since} AS since FROM hosts_device d"
            " WHERE d.id = %s) s",
            [
                DeviceOutcome.Source.SPOT_CHECK.value,
                Verification.Verdict.PLAUSIBLE.value,
                Verification.Verdict.CLEARED.value,
                *since_params,
                counts.device_id,
            ],
        )
        row = cursor.fetchone()
    if row is None or row[0] is None:
        return 0.0
    return settings.BALLAST_VERIFY_SUSPECT_RATE * 0.5 ** (
        row[1] / settings.BALLAST_VERIFY_SUSPECT_PASSES
    )


# the parts of the rate, in the order of their settings (``verification_due``)
_PARTS = (_base_rate, _new_rate, _suspect_rate)
