"""A failed check of a device's honesty and what follows it (DESIGN.md "Spot
checks"): a failed spot check, or a token count inflated past the recount."""

from __future__ import annotations

import logging
from datetime import datetime

from billing.services import earnings_reverse_held
from hosts.models import Device, DeviceOutcome
from hosts.services import device_outcome_record
from jobs.rentals import rentals_after_check

log = logging.getLogger("ballast.jobs")


def device_check_failed(
    *, device_id: int, model_id: str, detail: str, now: datetime, job_ref: str = ""
) -> int:
    """Record a failed check of the device: an outcome against its score (and
    quarantine judged; its machine's suspicion starts again from it,
    ``hosts.services.machine_suspected_since``), every earning still held of
    every device its machine has had reversed (a renamed device keeps
    nothing), a rental on it stopped. Returns how many held earnings were
    reversed. ``detail``: the finding in words and ``job_ref``: the checked
    job's id, kept on the outcome for staff. In the caller's transaction."""
    device_outcome_record(
        device_id=device_id,
        success=False,
        source=DeviceOutcome.Source.SPOT_CHECK,
        reason="spot_check_failed",
        model_id=model_id,
        now=now,
        job_ref=job_ref,
        detail=detail,
    )
    reversed_count = earnings_reverse_held(
        machine_id=Device.objects.values_list("machine_id", flat=True).get(
            id=device_id
        ),
        reason=f"failed check: {detail}"[:300],
        now=now,
    )
    log.warning(
        "device %s failed a check (%s); %d held earnings reversed",
        device_id,
        detail,
        reversed_count,
    )
    rentals_after_check(device_id=device_id, passed=False, now=now)
    return reversed_count
