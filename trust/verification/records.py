"""Verifications as rows: chosen at a job's end, a verifier picked, its scores
judged and paid, and what follows for the verified device (DESIGN.md
"Verifying real answers"; docs/design-notes.md "Verification of real answers").

Every function here runs in a transaction of its own (or the caller's) and
writes rows only; sending the ``verify`` frame is ``offers``' (after commit).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from billing.receipts import receipt_verify
from hosts.services import device_outcome_record
from jobs.formats import IDS_NEEDED_ABOVE_TEMPERATURE
from jobs.models import Attempt, Job, Verification
from jobs.tokens import token_count

from .answers import verified_answer
from .calibration import calibration_sample_add, sample_open, thresholds_of
from .checks import check_judged
from .offers import verification_send
from .plausibility import (
    AnswerStats,
    Plausibility,
    TokenScore,
    answer_plausible,
    answer_stats,
)
from .rate import verification_draw, verification_due
from .verdicts import round_after_failure, verdict_follow
from .verifiers import scores_cover_answer, verification_open, verifier_pay

log = logging.getLogger("ballast.jobs")

# the longest answer verified, in billed tokens: its ``scores`` frame (about
# 90 bytes an entry) stays within the host frame bound (256 KiB)
VERIFY_MAX_TOKENS = 2048
# the hottest answer verified as its text tokenized again (no ids of its
# host): retokenizing a hotter answer splits it otherwise than the sampler
# drew it too often for the judge's margins; with the host's ids an answer
# at any temperature is
VERIFY_MAX_TEMPERATURE = IDS_NEEDED_ABOVE_TEMPERATURE  # (such jobs need token_ids)
# the coolest non-greedy temperature a check of verifiers is drawn at (z is
# calibrated from here: plausibility.Z_TEMPERATURES)
VERIFY_MIN_TEMPERATURE = 0.5
V = Verification


def verifiable(job: Job, attempts: list[Attempt]) -> bool:
    """Whether a finished job's answer may be verified: a renter's job (not a
    spot check) that succeeded with output in one fresh attempt (no
    continuation), within ``VERIFY_MAX_TOKENS``, at a temperature up to
    ``VERIFY_MAX_TEMPERATURE`` (None is 1), or above it when its host's
    token ids are known (``Attempt.verify_token_ids``: the tokens drawn are
    judged; fresh-eyes review 3: answers at 0.3 or 1.5 were never checked;
    outside ``plausibility.Z_TEMPERATURES`` the support alone judges), with
    text left to verify once
    what the coordinator saw in the host's token ids is left out (a stop
    sequence's cut last token, bytes that are no character:
    ``exemptions.verified_text``, ``Attempt.verify_text``; never on the host's
    ``finish_reason`` or a U+FFFD it wrote), and not of a rental (its renter
    rents that device: its prompts go to no one else). An answer under a
    ``response_format`` is verified under the same grammar, as the tokens its
    host drew when it sent their ids, else as its text tokenized again: a
    host that leaves its ids out is not spared verification (fresh-eyes
    review 3: a cheat's constrained answers never were), and an honest one
    sends them (docs/protocol-notes.md, 2026-12-07: a grammar's splits are
    not the tokenizer's)."""
    params = job.params or {}
    temperature = params.get("temperature")
    temperature = 1.0 if temperature is None else float(temperature)
    return (
        job.status == Job.Status.SUCCEEDED
        and not job.is_spot_check
        and job.renter_id is not None
        and bool(job.output_text)
        and len(attempts) == 1
        and attempts[0].kind == Attempt.Kind.FRESH
        and attempts[0].outcome == Attempt.Outcome.SUCCEEDED
        and attempts[0].verify_text != ""
        and 0 < job.tokens_billed <= VERIFY_MAX_TOKENS
        and (
            temperature <= VERIFY_MAX_TEMPERATURE
            or attempts[0].verify_token_ids is not None
        )
        and job.rental_id is None
    )


def verification_choose(
    *, job: Job, attempts: list[Attempt], now: datetime
) -> Verification | None:
    """At the end of ``job`` (``services.job_finish``, in its transaction, with
    its attempts): draw whether its answer is verified, at its device's
    ``verification_rate``, and if so store round 1 (``offered`` to a verifier,
    or ``no_verifier``); while its model's verification is not calibrated
    (``calibration.thresholds_of``), a calibration ``sample`` of a trusted
    device's answer or ``uncalibrated`` (``calibration.sample_open``).
    Returns that row, or None (not verifiable, not drawn). The one place a
    verification of a real answer begins."""
    if not verifiable(job, attempts):
        return None
    attempt = attempts[0]
    if not verification_due(device_id=attempt.device_id, draw=verification_draw()):
        return None
    if thresholds_of(job.model_id) is None:
        return sample_open(job=job, attempt=attempt, now=now)
    return verification_open(job=job, attempt=attempt, round=1, now=now)


class VerificationNotOpen(Exception):
    """Scores for a verification that is not (or no longer) offered to the
    machine that sent them; the message says so."""


def _open_verification(verification_id: str, machine_id: str) -> Verification | None:
    """The ``offered`` verification of this id whose verifier is on machine
    ``machine_id``, locked; None otherwise (unknown, ended, another's)."""
    return (
        Verification.objects.select_for_update(of=("self",))
        .select_related(
            "job", "canary", "attempt__device__machine", "verifier__machine"
        )
        .filter(
            id=verification_id,
            status=V.Status.OFFERED,
            verifier__machine_id=machine_id,
        )
        .first()
    )


@transaction.atomic
def verification_scored(
    *,
    verification_id: str,
    machine_id: str,
    tokens: list[TokenScore],
    receipt: str,
    now: datetime | None = None,
) -> str | None:
    """Judge the ``tokens`` scores (``plausibility.token_scores_parse`` of a
    ``scores`` frame) and ``receipt`` a verifier on machine ``machine_id``
    sent for verification ``verification_id`` (hex).

    Refused against the verifier (``verification_refused``): a count that
    cannot be the whole answer (``scores_cover_answer``: one score per token
    id the ``verify`` carried), a receipt that does not verify (over the
    verification's id, the count and the answer's text, with the verifier
    machine's pinned key). Else scored (``answer_plausible`` at the job's
    temperature with its model's thresholds, ``calibration.thresholds_of``),
    the verifier paid for the prefill (``verifier_pay``), and the verdict
    followed (``verdict_follow``). A calibration ``sample`` is not judged:
    its statistics are kept (``calibration.calibration_sample_add``), the
    verifier paid, nothing follows; nor is an answer whose model lost its
    calibration meanwhile (its weights re-pinned): ``unconfirmed``, paid.
    Returns the id (hex) of a round 2 to send, else None. Raises
    ``VerificationNotOpen`` (changing nothing) when the verification is not
    offered to this machine or no longer open (refused, past its deadline)."""
    now = now or timezone.now()
    ver = _open_verification(verification_id, machine_id)
    if ver is None:
        raise VerificationNotOpen(
            f"verification {verification_id[:40]} is not open here"
            " (unknown, already ended, or past its deadline)"
        )
    verified = verified_answer(ver)
    answer = verified.answer
    recount = token_count(verified.model_id, answer)
    if not scores_cover_answer(
        n=len(tokens), answer=answer, recount=recount, token_ids=verified.token_ids
    ):
        told = recount if verified.token_ids is None else len(verified.token_ids)
        detail = f"{len(tokens)} scores for an answer of {told} tokens"
        return _verifier_failed(ver, V.Status.REFUSED, detail, now)
    if not receipt_verify(
        public_key_b64=ver.verifier.machine.public_key,
        signature_b64=receipt,
        job=ver.id.hex,
        completion_tokens=len(tokens),
        text=answer,
    ):
        return _verifier_failed(
            ver, V.Status.REFUSED, "the receipt does not verify", now
        )
    thresholds = thresholds_of(verified.model_id)
    try:
        stats = answer_stats(tokens)
        judged = (
            answer_plausible(
                temperature=verified.temperature, tokens=tokens, thresholds=thresholds
            )
            if thresholds is not None and ver.verdict != V.Verdict.SAMPLE
            else None
        )
    except ValueError as exc:  # numbers no model gives (a z that is not finite)
        return _verifier_failed(ver, V.Status.REFUSED, str(exc), now)
    # paid for the answer's tokens as its host was (never more than it billed)
    paid = min(len(tokens), recount if verified.billed is None else verified.billed)
    if judged is None:  # a calibration sample, or a model no longer calibrated
        _unjudged_store(ver, stats, verified.model_id, now)
        verifier_pay(ver, verified, tokens=paid, now=now)
        ver.save()
        if ver.verdict == V.Verdict.SAMPLE:
            calibration_sample_add(
                ver=ver, stats=stats, temperature=verified.temperature, now=now
            )
        return None
    _judged_store(ver, judged, now)
    if ver.canary_id is not None:
        if check_judged(ver, judged, now):
            verifier_pay(ver, verified, tokens=paid, now=now)
            ver.save(update_fields=["paid_nano"])
        return None
    verifier_pay(ver, verified, tokens=paid, now=now)
    # no success on the verifier's score: scores of an answer nobody knows
    # the truth of prove no work done (fresh-eyes review 3: a host refusing
    # renters' jobs kept its score up by verifying); only a check of
    # verifiers passed counts (``checks.check_judged``), a failure always
    return verdict_follow(ver, plausible=judged.plausible, now=now)


def _judged_store(ver: Verification, judged: Plausibility, now: datetime) -> None:
    ver.status = V.Status.SCORED
    ver.n, ver.z, ver.misses = judged.n, judged.z, judged.misses
    ver.outside, ver.plausible = judged.outside, judged.plausible
    ver.detail = judged.detail[:300]
    ver.scored_at = now


def _unjudged_store(
    ver: Verification, stats: AnswerStats, model_id: str, now: datetime
) -> None:
    ver.status, ver.plausible, ver.scored_at = V.Status.SCORED, None, now
    ver.n, ver.z = stats.n, stats.z
    ver.misses, ver.outside = stats.misses, stats.outside
    if ver.verdict == V.Verdict.SAMPLE:
        ver.detail = f"a calibration sample of {model_id}: z {stats.z:.2f}"
    else:
        ver.verdict = V.Verdict.UNCONFIRMED
        ver.detail = f"not judged: verification of {model_id} is not calibrated"
    ver.detail += (
        f", {stats.misses} of {stats.n} below the top, {stats.outside} outside"
    )


def _verifier_failed(
    ver: Verification, status: str, detail: str, now: datetime
) -> str | None:
    """End ``ver`` as the verifier's failure (``refused`` or ``expired``): an
    outcome against the verifier's score, nothing against the verified host;
    a confirming round that failed is asked of another verifier
    (``verdicts.round_next``: its id, hex, returned to be sent)."""
    ver.status, ver.detail, ver.scored_at = status, detail[:300], now
    ver.save(update_fields=["status", "detail", "scored_at"])
    device_outcome_record(
        device_id=ver.verifier_id,
        success=False,
        reason=f"verify_{status}",
        model_id=ver.canary.model_id if ver.canary_id else ver.job.model_id,
        now=now,
        job_ref=str(ver.job_id or ""),
        detail=f"verification {ver.id}: {detail}",
    )
    log.info(
        "verification %s: verifier %s %s (%s)", ver.id, ver.verifier_id, status, detail
    )
    return round_after_failure(ver, now)


@transaction.atomic
def verification_refused(
    *, verification_id: str, machine_id: str, detail: str, now: datetime | None = None
) -> str | None:
    """The verifier on machine ``machine_id`` answered verification
    ``verification_id`` (hex) with an ``error`` or a malformed ``scores``
    (``detail`` says which): ``refused``, against the verifier (a refused
    offer). Returns the id (hex) of the round asked of another verifier
    instead, to be sent (``_verifier_failed``), else None (also when it was
    not open there)."""
    ver = _open_verification(verification_id, machine_id)
    if ver is None:
        return None
    return _verifier_failed(ver, V.Status.REFUSED, detail, now or timezone.now())


def verifications_expire(*, now: datetime | None = None) -> int:
    """Expire the verifications offered more than ``BALLAST_VERIFY_DEADLINE_S``
    ago without scores (Celery beat); returns how many. Against the verifier
    when its ``verify`` was sent on the connection it still has; one never
    sent (its coordinator process stopped first), or sent on a connection
    that closed since (the agent stopped or restarted: fresh-eyes review 3),
    expires against nobody. A confirming round that expired is
    asked of another verifier, sent from here (``offers.verification_send``)."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.BALLAST_VERIFY_DEADLINE_S)
    expired = 0
    for ver_id in Verification.objects.filter(
        status=V.Status.OFFERED, offered_at__lt=cutoff
    ).values_list("id", flat=True):
        ended, nxt = _verification_expire(ver_id, now)
        expired += ended
        if nxt is not None:
            async_to_sync(verification_send)(nxt)
    return expired


@transaction.atomic
def _verification_expire(ver_id, now: datetime) -> tuple[int, str | None]:
    ver = (
        Verification.objects.select_for_update(of=("self",))
        .select_related("job", "canary", "attempt", "verifier__machine")
        .filter(id=ver_id, status=V.Status.OFFERED)
        .first()
    )
    if ver is None:
        return 0, None
    machine = ver.verifier.machine if ver.verifier_id else None
    lost = ver.sent_at is not None and machine is not None and (
        not machine.connected
        or (machine.connected_at is not None and machine.connected_at > ver.sent_at)
    )  # its connection closed since (an agent restarted): lost, no one's fault
    if ver.sent_at is None or lost:
        detail = "never sent" if ver.sent_at is None else "its verifier's connection closed"
        ver.status, ver.detail, ver.scored_at = V.Status.EXPIRED, detail, now
        ver.save(update_fields=["status", "detail", "scored_at"])
        return 1, round_after_failure(ver, now)
    detail = f"no scores within {settings.BALLAST_VERIFY_DEADLINE_S:g} s"
    return 1, _verifier_failed(ver, V.Status.EXPIRED, detail, now)
