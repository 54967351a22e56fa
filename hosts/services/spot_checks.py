"""When a device's next spot check is due (DESIGN.md "Spot checks (canaries)").

The checks themselves (canaries, judging, rentals) are sent and judged by
``jobs``; hosts only mark a check due and say which machines have one.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from ..models import Device


def spot_check_mark_due(
    *, device_id: int, reason: str, now: datetime | None = None
) -> bool:
    """Mark a spot check due on the device after a random delay (0–60 s).

    ``reason``: ``return``, ``first_load``, ``quarantine`` or the caller's own.
    The delay keeps its timing from telling the host anything. A check already due
    is kept (the earlier one wins). Returns True when this call marked it (False
    too with ``BALLAST_SPOT_CHECKS`` off).
    """
    if not settings.BALLAST_SPOT_CHECKS:
        return False
    now = now or timezone.now()
    due = now + timedelta(
        seconds=random.uniform(0, settings.BALLAST_SPOT_CHECK_MAX_DELAY_S)
    )
    return bool(
        Device.objects.filter(id=device_id, spot_check_due_at__isnull=True).update(
            spot_check_due_at=due, spot_check_reason=reason
        )
    )


def machines_spot_check_due(*, lease_id, now: datetime) -> list[str]:
    """Ids (str) of machines connected under this lease with a spot check, or a
    check of one of its devices as a verifier, due by ``now``."""
    return [
        str(mid)
        for mid in Device.objects.filter(
            Q(spot_check_due_at__lte=now) | Q(verifier_check_due_at__lte=now),
            machine__lease_id=lease_id,
            machine__connected=True,
        )
        .values_list("machine_id", flat=True)
        .distinct()
    ]
