"""What the verdicts of a renter's answer mean for its host (DESIGN.md
"Verifying real answers"; docs/trust.md "Two verifiers").

Round 1 plausible: nothing follows, but for ``BALLAST_VERIFY_SECOND_SHARE``
of them, drawn (``second_opinion_drawn``), which go on as an implausible one
does. Otherwise rounds are asked of verifiers of
owners none of the earlier rounds had (a trusted one while any qualifies,
``verifiers.verification_open``), up to ``MAX_ROUNDS``, until two agree: two
implausible verdicts fail the host (``services.device_check_failed``), two
plausible ones clear it; either way every verifier that said the contrary is
outvoted (``checks.verifier_outvoted``: a failure on its score, its trust
reset). A round that fails (an ``error``, malformed
scores, no scores in time) is asked again of another verifier; no verifier
left, or ``MAX_ROUNDS`` asked: ``unconfirmed``, nothing follows for anyone,
but a spot check of the host marked due when a round found it implausible.
A confirming round never goes to an owner an earlier round had; a colluder's
lie in one is outvoted and costs it its trust, and its refusal only brings the
next verifier.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings

from hosts.services import spot_check_mark_due
from jobs.models import Verification

from ..failures import device_check_failed
from .checks import verifier_outvoted
from .rate import verification_draw
from .verifiers import verification_open

V = Verification
MAX_ROUNDS = 4
"""The most rounds asked for one answer (two agreeing verdicts end it sooner)."""


def verdict_follow(ver: Verification, *, plausible: bool, now: datetime) -> str | None:
    """Round ``ver`` of a renter's answer was scored ``plausible`` (or not);
    saves it and does what the rounds so far decide (the module's rules).
    Returns the id (hex) of the next round to send, else None."""
    if ver.round == 1 and plausible:
        second = second_opinion_drawn()
        ver.verdict = V.Verdict.PLAUSIBLE
        ver.save()
        if not second:
            return None
        nxt = round_next(ver, _rounds(ver), now)
        if nxt is None:  # nobody to ask: round 1's word stands
            _verdicts_set([ver], V.Verdict.PLAUSIBLE)
        return nxt
    ver.save()
    rounds = _rounds(ver)
    said_no = [r for r in rounds if r.status == V.Status.SCORED and r.plausible is False]
    said_yes = [r for r in rounds if r.status == V.Status.SCORED and r.plausible]
    if len(said_no) >= 2:
        _decided(rounds, V.Verdict.FAILED, agreeing=said_no, contrary=said_yes, now=now)
        device_check_failed(
            device_id=ver.device_id,
            model_id=ver.job.model_id,
            detail=f"verification of job {ver.job_id}: implausible twice"
            f" ({'; '.join(r.detail for r in said_no[:2])})",
            now=now,
            job_ref=str(ver.job_id),
        )
        return None
    if len(said_yes) >= 2:
        _decided(rounds, V.Verdict.CLEARED, agreeing=said_yes, contrary=said_no, now=now)
        return None
    return round_next(ver, rounds, now)


def second_opinion_drawn() -> bool:
    """Whether a round 1 found plausible is asked of a second verifier all the
    same: ``BALLAST_VERIFY_SECOND_SHARE`` of them, drawn with ``secrets``
    (``rate.verification_draw``), so one account's word never ends a
    verification it cannot know is final (sybil verifiers: docs/trust.md)."""
    return verification_draw() < settings.BALLAST_VERIFY_SECOND_SHARE


def round_after_failure(ver: Verification, now: datetime) -> str | None:
    """A round that ended unscored (``records._verifier_failed``, or never
    sent): a confirming round of a renter's answer is asked of another
    verifier (``round_next``); round 1 and checks of verifiers end there.
    Returns the next round's id (hex) to send, else None."""
    if ver.canary_id is not None or ver.round == 1:
        return None
    return round_next(ver, _rounds(ver), now)


def round_next(ver: Verification, rounds: list[Verification], now: datetime) -> str | None:
    """Ask the next round of ``ver``'s answer of a verifier of an owner none of
    ``rounds`` had; every round ``confirming`` then, or all ``unconfirmed``
    when none qualifies or ``MAX_ROUNDS`` were asked. Returns its id (hex)."""
    if len(rounds) < MAX_ROUNDS:
        nxt = verification_open(
            job=ver.job,
            attempt=ver.attempt,
            round=len(rounds) + 1,
            now=now,
            exclude_owners={r.verifier.machine.owner_id for r in rounds if r.verifier_id},
        )
        if nxt.verifier_id is not None:
            _verdicts_set(rounds, V.Verdict.CONFIRMING)
            return nxt.id.hex
        rounds = [*rounds, nxt]
    _verdicts_set(rounds, V.Verdict.UNCONFIRMED)
    if any(r.status == V.Status.SCORED and r.plausible is False for r in rounds):
        # one verifier's word fails nobody, but the host's next spot check
        # comes now rather than by chance (fresh-eyes review 5: a cheat with one
        # other owner online was flagged 12 times and never checked)
        spot_check_mark_due(device_id=ver.device_id, reason="unconfirmed", now=now)
    return None


def _rounds(ver: Verification) -> list[Verification]:
    return list(
        Verification.objects.filter(job_id=ver.job_id)
        .select_related("verifier__machine")
        .order_by("round")
    )


def _verdicts_set(rounds: list[Verification], verdict: str) -> None:
    Verification.objects.filter(id__in=[r.id for r in rounds]).update(verdict=verdict)


def _decided(rounds, verdict: str, *, agreeing, contrary, now: datetime) -> None:
    """Every round takes ``verdict``; each ``contrary`` verifier is outvoted
    (``checks.verifier_outvoted``: a failure on its score and its trust reset,
    so checks come often again; not a failed check of its honesty, which two
    colluding accounts could then inflict on an honest verifier)."""
    _verdicts_set(rounds, verdict)
    for wrong in contrary:
        verifier_outvoted(
            verifier_id=wrong.verifier_id, model_id=wrong.job.model_id, now=now
        )
