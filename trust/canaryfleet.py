"""Checks' answers established by the fleet, for models this coordinator
cannot run (issue 31 item 4; DESIGN.md "Spot checks").

A model with no reference engine here (``trust.canarypool.reference_engine_kept``)
still gets a pool: its prompts are drawn as for any model (``canary_pool_draw``:
under the deployment's secret, at temperature 0, each with a short expected
answer that the generator knows and a text either contains or not), and stay
*candidates* (``drawn``) until trusted devices of at least ``QUORUM``
different owners have answered one right, sent to them as an ordinary spot
check (reason ``calibration``: the host cannot tell it from a check or a job).
Then it joins the pool (``calibrated``); a trusted device that answers it
wrong, naming another answer or none, rejects it (the model does not give
that answer reliably, so an honest host could fail it). A candidate's answer
counts against no one: it is a vote, never an outcome of the device; an
answer that did not arrive, or with a token count not believed, is no vote.

What is judged is what stays stable across GPUs and engines: the expected
answer's presence (``trust.canaries.answer_right``), not a byte-exact text.

Trusted: ``trust.trusted.devices_trusted`` (staff's reference devices, or an
established clean record), which verification's calibration samples share.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db.models import Count, Q
from django.utils import timezone

from catalog.models import CatalogModel
from hosts.models import Device
from hosts.services import spot_check_mark_due
from jobs.models import CanaryPrompt, Job, SpotCheck

from .canarypool import (
    BATCH,
    canary_pool_draw,
    canary_pool_need,
    reference_engine_kept,
)
from .trusted import TRUST_DAYS, TRUST_OUTCOMES, devices_trusted  # noqa: F401

log = logging.getLogger("ballast.spotchecks")

QUORUM = 2
"""Different owners whose trusted devices must answer a candidate right."""
NO_VOTE = ("no answer", "unbelievable token count")
"""Starts of a verdict's detail that are no vote on the candidate's answer."""


def fleet_candidates_ask(*, now: datetime | None = None) -> int:
    """Ask the fleet for the answers of candidates (Celery beat): for each
    active model with no reference engine here whose pool needs prompts
    (``canary_pool_need``), draw candidates up to ``BATCH`` open ones, and
    mark a ``calibration`` check due on the best trusted device of each
    owner that has a candidate open to it (``candidate_pick``); nothing while
    fewer than ``QUORUM`` owners have one (logged).
    Returns how many checks were marked."""
    now = now or timezone.now()
    marked = 0
    for model in CatalogModel.objects.filter(active=True).order_by("id"):
        if reference_engine_kept(model.id):
            continue
        need = canary_pool_need(model_id=model.id, now=now)
        if not need:
            continue
        per_owner: dict[int, Device] = {}
        for device in devices_trusted(model=model, now=now):
            per_owner.setdefault(device.machine.owner_id, device)
        if len(per_owner) < QUORUM:
            log.info(
                "no check of %s can be calibrated: trusted devices of %d owner(s), "
                "%d needed",
                model.id,
                len(per_owner),
                QUORUM,
            )
            continue
        candidates = CanaryPrompt.objects.filter(
            model_id=model.id, status=CanaryPrompt.Status.DRAWN
        ).count()
        if candidates < min(need, BATCH):
            canary_pool_draw(model_id=model.id, count=min(need, BATCH) - candidates)
        for device in per_owner.values():
            if candidate_pick(device=device, model_id=model.id) is None:
                continue  # it answered every open candidate already
            marked += spot_check_mark_due(
                device_id=device.id, reason=SpotCheck.Reason.CALIBRATION, now=now
            )
    return marked


def candidate_pick(*, device: Device, model_id: str) -> CanaryPrompt | None:
    """A candidate of the model for this (trusted) device to answer; None when
    none is open for it (nor for a model a reference engine here runs): never one sent to the owner before, nor one with
    ``QUORUM`` answers right or pending already (two picks at once may ask
    one owner more: harmless). Its ``sent_count`` stays 0: its answers are
    its calibration, as the reference model's are, and a device of each
    voter's owner never gets it again (``canary_pick``)."""
    if reference_engine_kept(model_id):
        return None  # its drawn prompts are the reference engine's to calibrate
    owner = device.machine.owner_id
    seen = SpotCheck.objects.filter(device__machine__owner_id=owner).values(
        "canary_id"
    )
    return (
        CanaryPrompt.objects.filter(model_id=model_id, status=CanaryPrompt.Status.DRAWN)
        .exclude(id__in=seen)
        .annotate(
            votes=Count("checks", filter=Q(checks__passed__isnull=True))
            + Count("checks", filter=Q(checks__passed=True))
        )
        .filter(votes__lt=QUORUM)
        .order_by("index")
        .first()
    )


def candidate_vote(
    *, check: SpotCheck, passed: bool, detail: str, now: datetime
) -> None:
    """Record a trusted device's answer to a candidate (``check``, reason
    ``calibration``, its verdict ``passed`` with ``detail`` from
    ``trust.spotchecks.spot_check_verdict``) and settle the candidate: it
    joins the pool once devices of ``QUORUM`` owners answered it right; a
    wrong answer rejects it. Nothing is recorded against the device."""
    check.passed, check.detail, check.judged_at = passed, detail, now
    check.save(update_fields=["passed", "detail", "judged_at"])
    canary = CanaryPrompt.objects.select_for_update().get(id=check.canary_id)
    if canary.status != CanaryPrompt.Status.DRAWN:
        return
    if not passed and not detail.startswith(NO_VOTE):
        canary.status = CanaryPrompt.Status.REJECTED
        canary.calibrated_at = now
        canary.save(update_fields=["status", "calibrated_at"])
        log.info("candidate %s rejected: %s (check %s)", canary, detail, check.id)
        return
    right = SpotCheck.objects.filter(
        canary=canary, reason=SpotCheck.Reason.CALIBRATION, passed=True
    )
    owners = right.values("device__machine__owner_id").distinct().count()
    if owners < QUORUM:
        return
    job = Job.objects.get(id=check.job_id)
    canary.status = CanaryPrompt.Status.CALIBRATED
    canary.reference_output = job.output_text[:2000]
    canary.calibrated_at = now
    canary.save(update_fields=["status", "reference_output", "calibrated_at"])
    log.info("candidate %s joined the pool: %d owners agree", canary, owners)
