"""What the live fleet offers: a model's live capacity (``model_capacity``:
``devices_online``, ``slots_free``; ``/v1/models`` and ``ballast.metrics_view``)
and the devices a renter may rent (``devices_rentable``: ``/v1/devices``, the
renter's page).
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, QuerySet, Sum

from hosts.models import Device

from .eligibility import devices_live, devices_rented


def devices_rentable(*, now: datetime, renter=None) -> QuerySet[Device]:
    """Live devices a renter may rent: not paused, not quarantined, not rented,
    and (with ``renter``, a user) not the renter's own (``rentals.rental_create``
    refuses those)."""
    devices = (
        devices_live(now=now)
        .filter(quarantined=False, paused=False)
        .exclude(devices_rented())
        .select_related("machine")
    )
    if renter is not None:
        devices = devices.exclude(machine__owner_id=renter.pk)
    return devices


def model_capacity(*, model_id: str, now: datetime) -> dict[str, int]:
    """A model's live capacity: ``devices_online``, the live devices with it
    loaded; ``slots_free``, the free slots of those that can take serverless work
    now (not paused, quarantined or rented). Shown by ``/v1/models`` and graphed
    (``ballast.metrics_view``)."""
    live = devices_live(now=now).filter(models__model_id=model_id, models__loaded=True)
    usable = live.filter(
        paused=False,
        quarantined=False,
        machine__paused=False,
        machine__host_paused=False,
        machine__accepts_serverless=True,
        machine__agent_accepts_serverless=True,
    ).exclude(devices_rented())
    online = live.aggregate(devices=Count("id", distinct=True))
    slots = usable.aggregate(total=Sum("slots_total"), used=Sum("slots_used"))
    return {
        "devices_online": online["devices"] or 0,
        "slots_free": max(0, (slots["total"] or 0) - (slots["used"] or 0)),
    }
