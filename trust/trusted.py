"""Which devices the platform trusts for a model (DESIGN.md "Spot checks":
"staff's reference devices, or established devices of at least two owners
that agree"): they establish the answers of its checks
(``trust.canaryfleet``) and, with trusted verifiers, the honest answers its
verification is calibrated from (``trust.verification.calibration``).

Trusted: marked a reference device by staff (``Device.reference``), or an
established clean record: first seen at least ``TRUST_DAYS`` days ago, at
least ``TRUST_OUTCOMES`` outcomes recorded, never a failed spot check. Live
with the model loaded from its pinned weights, not quarantined, paused,
retired or rented.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Count, Exists, OuterRef, Q, QuerySet

from catalog.models import CatalogModel
from hosts.liveness import live_q
from hosts.models import Device, DeviceOutcome
from jobs.models import Rental
from jobs.selectors import model_loaded

TRUST_DAYS = 7
"""Days since a device was first seen, at least, for a clean record."""
TRUST_OUTCOMES = 50
"""Outcomes recorded of a device, at least, for a clean record."""


def devices_trusted(*, model: CatalogModel, now: datetime) -> QuerySet[Device]:
    """The devices trusted now to establish a check's answer of ``model``, or
    to give and score the honest answers its verification is calibrated
    from (module docstring), best score first."""
    failed_check = DeviceOutcome.objects.filter(
        device=OuterRef("pk"), source=DeviceOutcome.Source.SPOT_CHECK, success=False
    )
    rented = Rental.objects.filter(
        device=OuterRef("pk"), status__in=Rental.OPEN_STATUSES
    )
    return (
        Device.objects.filter(
            live_q(now, prefix="machine__"),
            model_loaded(model),
            slots_total__gt=0,
            retired_at__isnull=True,
            quarantined=False,
            paused=False,
            machine__paused=False,
            machine__retired_at__isnull=True,
        )
        .exclude(Exists(rented))
        .annotate(outcome_count=Count("outcomes"))
        .filter(
            Q(reference=True)
            | (
                Q(
                    first_seen_at__lte=now - timedelta(days=TRUST_DAYS),
                    outcome_count__gte=TRUST_OUTCOMES,
                )
                & ~Exists(failed_check)
            )
        )
        .select_related("machine")
        .order_by("-score", "id")
    )
