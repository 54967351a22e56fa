"""Checks of verifiers: verifications whose verdict the coordinator knows
(DESIGN.md "Verifying real answers"; docs/trust.md "Who checks the verifiers").

A verifier's word decides whether a host fails, and its pay does not depend
on having scored anything; so its word is checked as a host's work is. A check
is a ``verify`` like any other, on the conversation of a calibrated spot-check
prompt never sent to the verifier's owner, with either the reference model's
own answer (plausible) or a decoy (the model's answer sampled hotter, another
prompt's answer, or its answer with other words in it), at the check's
temperature; the reference model judged both at calibration, with a margin
(``check_calibration``). Which of the two is sent is drawn with ``secrets``; a verifier that judges as the reference model passed,
otherwise it fails a check of its honesty (``services.device_check_failed``:
score, held earnings reversed, quarantine judged).

Checks are planned on their own clock (``verifier_checks_plan``, Celery
beat): a verifying device is sent one every ``BALLAST_VERIFIER_CHECK_NEW_EVERY_S``
on average while it has passed fewer than ``BALLAST_VERIFIER_TRUST_PASSES``
in a row, then every ``BALLAST_VERIFIER_CHECK_EVERY_S``, at random moments
(the lease loop's poke sends them, ``verifier_checks_take_due``), so nothing
in their timing, or in a quiet spell, tells them from real ones. A trusted
verifier (``trusted``) is the only kind a confirming round goes to while one
is live (``verifiers.verification_open``), and the only kind whose plausible
verdicts lower a device's suspicion (``rate``).
"""

from __future__ import annotations

import logging
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from hosts.liveness import live_q
from hosts.models import Device, DeviceModel
from hosts.services import device_outcome_record
from jobs.models import CanaryPrompt, SpotCheck, Verification

from ..failures import device_check_failed
from .offers import verify_frame
from .plausibility import Plausibility

log = logging.getLogger("ballast.jobs")

CANDIDATES = 256
"""Prompts considered for one check (the least used first, then one at random)."""


def trusted(device: Device) -> bool:
    """Whether ``device`` has passed ``BALLAST_VERIFIER_TRUST_PASSES`` checks
    as a verifier since its last failed one."""
    return device.verifier_passes >= settings.BALLAST_VERIFIER_TRUST_PASSES


PLAN_EVERY_S = 60.0
"""How often Celery beat runs ``verifier_checks_plan`` (ballast/celery.py)."""


def verifier_checks_plan(*, now: datetime | None = None, every_s: float = PLAN_EVERY_S) -> int:
    """Plan checks of verifiers on their own clock (Celery beat, every
    ``every_s``): each live device whose machine says it verifies, with no
    check planned, gets one with the chance ``every_s`` over its mean gap
    (``BALLAST_VERIFIER_CHECK_NEW_EVERY_S`` while it is not trusted,
    ``BALLAST_VERIFIER_CHECK_EVERY_S`` once it is), drawn with ``secrets``,
    due at a moment drawn within the next ``every_s``. Real verifications play
    no part, so neither a check's timing nor a quiet spell tells a verifier
    which ``verify`` is real. Returns how many were planned (nothing with
    ``BALLAST_VERIFIER_CHECKS`` off)."""
    if not settings.BALLAST_VERIFIER_CHECKS:
        return 0
    now = now or timezone.now()
    trust = settings.BALLAST_VERIFIER_TRUST_PASSES
    planned = 0
    for device_id, passes in Device.objects.filter(
        live_q(now, prefix="machine__"),
        machine__verifies=True,
        retired_at__isnull=True,
        quarantined=False,
        verifier_check_due_at__isnull=True,
    ).values_list("id", "verifier_passes"):
        gap = (
            settings.BALLAST_VERIFIER_CHECK_EVERY_S
            if passes >= trust
            else settings.BALLAST_VERIFIER_CHECK_NEW_EVERY_S
        )
        if secrets.randbelow(10**6) >= min(1.0, every_s / gap) * 10**6:
            continue
        delay = timedelta(milliseconds=secrets.randbelow(int(every_s * 1000) + 1))
        planned += Device.objects.filter(
            id=device_id, verifier_check_due_at__isnull=True
        ).update(verifier_check_due_at=now + delay)
    return planned


def check_canary_pick(*, verifier: Device) -> CanaryPrompt | None:
    """A check for ``verifier``: a pool row of a model it has loaded, made a
    check, never sent to its owner (as a spot check or a check), one of the
    ``CANDIDATES`` least used drawn with ``secrets``; counted as sent."""
    owner = verifier.machine.owner_id
    models = DeviceModel.objects.filter(device=verifier, loaded=True).values("model_id")
    seen_checks = Verification.objects.filter(
        canary__isnull=False, verifier__machine__owner_id=owner
    ).values("canary_id")
    seen_spot = SpotCheck.objects.filter(device__machine__owner_id=owner).values(
        "canary_id"
    )
    ids = list(
        CanaryPrompt.objects.filter(
            model_id__in=models,
            status=CanaryPrompt.Status.CALIBRATED,
            check_temperature__isnull=False,
        )
        .exclude(decoy_output="")
        .exclude(id__in=seen_checks)
        .exclude(id__in=seen_spot)
        .order_by("sent_count", "id")
        .values_list("id", flat=True)[:CANDIDATES]
    )
    if not ids:
        return None
    chosen = secrets.choice(ids)
    CanaryPrompt.objects.filter(id=chosen).update(sent_count=F("sent_count") + 1)
    return CanaryPrompt.objects.get(id=chosen)


@transaction.atomic
def verifier_checks_take_due(
    *, machine_id: str, now: datetime | None = None
) -> list[tuple[str, dict]]:
    """The checks due on machine ``machine_id``'s devices (their
    ``verifier_check_due_at`` passed; each taken once, compare-and-set),
    stored ``offered`` and sent now: [(verification id hex, ``verify``
    frame)]. A device with no check left for it, retired, or whose machine
    no longer says it verifies gets none (its next verification plans again)."""
    now = now or timezone.now()
    taken = []
    for device in Device.objects.filter(
        machine_id=machine_id, verifier_check_due_at__lte=now
    ).select_related("machine"):
        if not Device.objects.filter(
            id=device.id, verifier_check_due_at=device.verifier_check_due_at
        ).update(verifier_check_due_at=None):
            continue
        if not device.machine.verifies or device.retired_at is not None:
            continue  # (its latest hello no longer says it verifies)
        canary = check_canary_pick(verifier=device)
        if canary is None:
            continue
        ver = Verification.objects.create(
            canary=canary,
            expected_plausible=secrets.randbelow(2) == 1,
            verifier=device,
            verifier_trusted=trusted(device),
            status=Verification.Status.OFFERED,
            offered_at=now,
            sent_at=now,
        )
        taken.append((ver.id.hex, verify_frame(ver=ver, device_index=device.index)))
    return taken


def check_judged(ver: Verification, judged: Plausibility, now: datetime) -> bool:
    """A check ``ver``'s scores were judged ``judged``: passed when the verdict
    is the reference model's (``expected_plausible``): a success on the
    verifier's score and one more pass; else a failed check of its honesty
    and its passes back to 0. Saves ``ver``; returns whether it passed."""
    passed = judged.plausible == ver.expected_plausible
    ver.verdict = Verification.Verdict.PASSED if passed else Verification.Verdict.FAILED
    ver.save()
    model_id = ver.canary.model_id
    if passed:
        Device.objects.filter(id=ver.verifier_id).update(
            verifier_passes=F("verifier_passes") + 1
        )
        device_outcome_record(  # (not a spot check: no suspicion decays by it)
            device_id=ver.verifier_id,
            success=True,
            reason="verifier_check_passed",
            model_id=model_id,
            now=now,
        )
        return True
    verifier_distrust(
        verifier_id=ver.verifier_id,
        model_id=model_id,
        detail=f"a check of its verifying: judged {'plausible' if judged.plausible else 'implausible'}"
        f" an answer the reference model finds {'plausible' if ver.expected_plausible else 'implausible'}"
        f" ({judged.detail})",
        now=now,
    )
    return False


def verifier_outvoted(*, verifier_id: int, model_id: str, now: datetime) -> None:
    """Two other verifiers agreed against this one's verdict on an answer: a
    failure on its score and its passes back to 0 (checked every
    ``BALLAST_VERIFIER_CHECK_NEW_EVERY_S`` until trusted again)."""
    Device.objects.filter(id=verifier_id).update(verifier_passes=0)
    device_outcome_record(
        device_id=verifier_id,
        success=False,
        reason="verify_outvoted",
        model_id=model_id,
        now=now,
    )


def verifier_distrust(*, verifier_id: int, model_id: str, detail: str, now: datetime) -> None:
    """A verifier's word on a check was found false: a failed check of its
    honesty (``services.device_check_failed``) and its passes back to 0."""
    Device.objects.filter(id=verifier_id).update(verifier_passes=0)
    device_check_failed(device_id=verifier_id, model_id=model_id, detail=detail, now=now)
