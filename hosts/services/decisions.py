"""Staff quarantine a device, or release it, with a reason its host reads
(issue 35: "why was my device quarantined?" answered on the machine page and
by email, ``hosts.models.QuarantineDecision``)."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from .. import emails
from ..models import Device, QuarantineDecision
from .trust import device_quarantine

REASON_MIN_CHARS = 10
REASON_MAX_CHARS = 500


class DecisionRefused(ValueError):
    """A staff decision that cannot be taken; the message says why, in words."""


def _reason_clean(reason: str) -> str:
    reason = " ".join((reason or "").split())
    if len(reason) < REASON_MIN_CHARS:
        raise DecisionRefused(
            f"Write the reason the host will read (at least {REASON_MIN_CHARS}"
            " characters)."
        )
    if len(reason) > REASON_MAX_CHARS:
        raise DecisionRefused(f"The reason is over {REASON_MAX_CHARS} characters.")
    return reason


@transaction.atomic
def device_quarantine_by_staff(
    *, device_id: int, staff, reason: str, now: datetime | None = None
) -> QuarantineDecision:
    """Quarantine the device as staff (``Device.QuarantineReason.STAFF``: spot
    checks only, 3 passes in a row to leave, a check due now), record
    ``reason`` and email the owner once the transaction commits. Raises
    DecisionRefused for a reason under ``REASON_MIN_CHARS`` characters or over
    ``REASON_MAX_CHARS``, or a device already quarantined; Device.DoesNotExist
    for an unknown one."""
    reason = _reason_clean(reason)
    now = now or timezone.now()
    device = Device.objects.select_for_update().get(id=device_id)
    if device.quarantined:
        raise DecisionRefused(f"{device.label} is already quarantined.")
    device_quarantine(
        device_id=device.id, reason=Device.QuarantineReason.STAFF, now=now
    )
    return _decided(device, QuarantineDecision.Action.QUARANTINE, staff, reason)


@transaction.atomic
def device_release_by_staff(
    *, device_id: int, staff, reason: str
) -> QuarantineDecision:
    """Release the device from quarantine as staff, whatever put it there,
    record ``reason`` and email the owner once the transaction commits. Raises
    DecisionRefused for a reason too short or long, or a device not
    quarantined; Device.DoesNotExist for an unknown one."""
    reason = _reason_clean(reason)
    device = Device.objects.select_for_update().get(id=device_id)
    if not device.quarantined:
        raise DecisionRefused(f"{device.label} is not quarantined.")
    Device.objects.filter(id=device.id).update(
        quarantined=False, quarantined_at=None, quarantine_reason=""
    )
    return _decided(device, QuarantineDecision.Action.RELEASE, staff, reason)


def _decided(device: Device, action: str, staff, reason: str) -> QuarantineDecision:
    decision = QuarantineDecision.objects.create(
        device=device, action=action, staff=staff, reason=reason
    )
    transaction.on_commit(lambda: emails.quarantine_decided(decision_id=decision.id))
    return decision
