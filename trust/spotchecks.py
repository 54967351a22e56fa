"""Spot checks (canaries): choosing, sending and judging them (DESIGN.md "Spot checks").

A spot check is a job with a known right answer, run on one device through the
same path as a renter's job: same offer shape, ids and timing, so the host cannot
tell them apart. Its prompt comes from the model's pool (``trust.canarypool``:
drawn under a secret in a real job's shape, calibrated on the reference model).
Celery only marks a check *due* on a device (a row change); the machine's own
connection picks it up (``spot_checks_take_due``) and runs it. A passed check is
paid to its host like a job, by the platform (``jobs.services.endings.job_charge``).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ballast import metrics
from catalog.models import CatalogModel
from hosts.models import Device, DeviceModel, DeviceOutcome
from hosts.services import (
    device_outcome_record,
    device_quarantine_release_judge,
    spot_check_mark_due,
)
from jobs.models import Job, Rental, SpotCheck
from jobs.rentals import rentals_after_check
from jobs.services import job_create

from .canaries import answer_right
from .canaryfleet import candidate_pick, candidate_vote, fleet_candidates_ask
from .canarypool import canary_pick
from .checkpools import device_models_runnable, models_checked
from .failures import device_check_failed

log = logging.getLogger("ballast.spotchecks")


@transaction.atomic
def spot_check_create(*, device: Device, reason: str) -> Job | None:
    """Create the spot-check job for a device; None when no loaded model of it
    (run from the weights its catalog entry pins) has a prompt left for it in
    the pool (``trust.canarypool.canary_pick``; for reason ``calibration``, a
    candidate whose answer the fleet establishes: ``trust.canaryfleet``).

    The job is the canary's, as a renter's job in the shape the canary was
    drawn in (endpoint, messages or prompt, params, stream).
    """
    loaded = list(
        DeviceModel.objects.filter(device=device, loaded=True).values_list(
            "model_id", "weights_sha256"
        )
    )
    for model_id, weights in loaded:
        model = CatalogModel.objects.filter(id=model_id).first()
        if model is None or not model.weights_match(weights):
            continue  # no work of a model it runs other weights of (rule 6)
        if reason == SpotCheck.Reason.CALIBRATION:  # a candidate's answer asked
            canary = candidate_pick(device=device, model_id=model_id)
        else:
            canary = canary_pick(device=device, model_id=model_id)
        if not canary:
            continue
        job = job_create(
            renter=None,
            api_key=None,
            model=model,
            endpoint=canary.endpoint,
            messages=canary.messages,
            prompt=canary.prompt,
            params=dict(canary.params),
            placement={},
            stream=canary.stream,
            is_spot_check=True,
            target_device_id=device.id,
        )
        SpotCheck.objects.create(
            device=device, canary=canary, job=job, reason=reason or "staff"
        )
        return job
    log.info(
        "device %s: no spot-check prompt of %s left for it yet", device.id, loaded
    )
    return None


def spot_checks_take_due(*, machine_id: str, now: datetime | None = None) -> list[Job]:
    """Take the spot checks due on this machine's devices and create their jobs.

    Each due mark is cleared by a compare-and-set, so only one connection (of any
    coordinator process) sends a given check. A check the pool cannot serve yet
    stays due (its mark put back), so it is sent once the pool is topped up; one
    for a device none of whose models has calibrated checks
    (``trust.checkpools``) is dropped, logged and counted
    (``ballast_spot_checks_dropped``): its machine page says so, a rental of it
    is refused.
    """
    if not settings.BALLAST_SPOT_CHECKS:
        return []
    now = now or timezone.now()
    jobs = []
    for device in Device.objects.filter(
        machine_id=machine_id, spot_check_due_at__lte=now
    ).select_related("machine"):
        taken = Device.objects.filter(
            id=device.id, spot_check_due_at=device.spot_check_due_at
        ).update(spot_check_due_at=None, spot_check_reason="")
        if not taken:
            continue
        job = spot_check_create(device=device, reason=device.spot_check_reason)
        if job is not None:
            jobs.append(job)
            continue
        if device.spot_check_reason == SpotCheck.Reason.CALIBRATION:
            continue  # no candidate open for it any more: nothing to ask
        runnable = device_models_runnable(device_id=device.id)
        if models_checked(runnable):
            Device.objects.filter(id=device.id, spot_check_due_at__isnull=True).update(
                spot_check_due_at=device.spot_check_due_at,
                spot_check_reason=device.spot_check_reason,
            )
        else:
            log.warning(
                "device %s: no calibrated spot checks for %s (no calibrated prompt "
                "in the pool, no reference engine on the coordinator); check %s "
                "dropped",
                device.id,
                ", ".join(runnable) or "any model it runs",
                device.spot_check_reason or "staff",
            )
            metrics.spot_check_dropped(model_ids=runnable)
    return jobs


def spot_check_verdict(*, job: Job, check: SpotCheck) -> tuple[bool, str]:
    """Judge a finished spot-check job: (passed, detail).

    Pass: the job succeeded, the expected answer appears in the output (and no
    other answer its prompt names: ``trust.canaries.answer_right``), and the
    reported token count is believable (not flagged when its attempt ended:
    ``jobs.services.segments.segment_tokens``).
    """
    attempt = job.attempts.order_by("-offered_at").first()
    if job.status != Job.Status.SUCCEEDED or attempt is None:
        outcome = attempt.outcome if attempt else "no attempt"
        return False, f"no answer ({outcome})"
    reported = attempt.completion_tokens_reported
    if reported is None or attempt.token_count_flagged:
        return (
            False,
            f"unbelievable token count {reported} for {len(job.output_text)} characters",
        )
    canary = check.canary
    if not answer_right(canary.expected, canary.distractors, job.output_text):
        return False, "expected answer missing"
    return True, "expected answer present"


@transaction.atomic
def spot_check_judge(*, job_id: str, now: datetime | None = None) -> SpotCheck:
    """Record a spot check's verdict and its consequences (DESIGN.md "Spot checks").

    Failure: an outcome against the score, every held earning of the device
    reversed, quarantine judged, a rental on it stopped. Pass: a quarantined device
    may be released (3 in a row); a pending rental goes live. A candidate's
    answer (reason ``calibration``) is a vote on the candidate, never an
    outcome of the device (``trust.canaryfleet.candidate_vote``). A check
    never offered to its device is no verdict (``passed`` stays None) and
    another is marked due.
    """
    now = now or timezone.now()
    check = (
        SpotCheck.objects.select_for_update()
        .select_related("canary", "job")
        .get(job_id=job_id)
    )
    if check.passed is not None:
        return check
    if not check.job.attempts.exists():
        # never offered (its device went offline, or stayed busy until the
        # queue's deadline): no answer of the device's to judge; a new one
        # is due (fresh-eyes review 3: an agent's graceful stop with a check
        # waiting was a failed check, its held earnings reversed)
        check.detail, check.judged_at = "not run: never offered to the device", now
        check.save(update_fields=["detail", "judged_at"])
        spot_check_mark_due(device_id=check.device_id, reason=check.reason, now=now)
        return check
    passed, detail = spot_check_verdict(job=check.job, check=check)
    if check.reason == SpotCheck.Reason.CALIBRATION:
        candidate_vote(check=check, passed=passed, detail=detail, now=now)
        return check
    check.passed, check.detail, check.judged_at = passed, detail, now
    check.save(update_fields=["passed", "detail", "judged_at"])
    metrics.spot_check_judged(passed=passed)
    if passed:
        device_outcome_record(
            device_id=check.device_id,
            success=True,
            source=DeviceOutcome.Source.SPOT_CHECK,
            reason="spot_check",
            model_id=check.job.model_id,
            now=now,
            job_ref=str(check.job_id),
            detail=f"spot check {check.id}: {detail}",
        )
        device_quarantine_release_judge(device_id=check.device_id)
        rentals_after_check(device_id=check.device_id, passed=True, now=now)
    else:
        device_check_failed(
            device_id=check.device_id,
            model_id=check.job.model_id,
            detail=f"spot check {check.id}: {detail}",
            now=now,
            job_ref=str(check.job_id),
        )
    return check


def spot_checks_schedule(*, now: datetime | None = None) -> int:
    """Mark spot checks due where time calls for one (Celery beat); returns how many.

    Quarantined devices every ``BALLAST_QUARANTINE_CHECK_EVERY_S`` (3 min); live
    rentals every ``BALLAST_RENTAL_CHECK_EVERY_S`` (30 min); trusted devices
    asked the answers of candidates of models no reference engine here runs
    (``trust.canaryfleet.fleet_candidates_ask``).
    """
    now = now or timezone.now()
    marked = 0
    quarantine_cutoff = now - timedelta(
        seconds=settings.BALLAST_QUARANTINE_CHECK_EVERY_S
    )
    for device_id in (
        Device.objects.filter(
            quarantined=True, spot_check_due_at__isnull=True, retired_at__isnull=True
        )
        .exclude(Q(spot_checks__created_at__gt=quarantine_cutoff))
        .values_list("id", flat=True)
        .distinct()
    ):
        marked += spot_check_mark_due(device_id=device_id, reason="quarantine", now=now)
    rental_cutoff = now - timedelta(seconds=settings.BALLAST_RENTAL_CHECK_EVERY_S)
    for rental in Rental.objects.filter(
        status=Rental.Status.LIVE, last_check_at__lt=rental_cutoff
    ):
        marked += spot_check_mark_due(
            device_id=rental.device_id, reason="rental", now=now
        )
    return marked + fleet_candidates_ask(now=now)
