"""Reads for the scheduler: eligible devices and why none could serve a request.

DESIGN.md "Picking a device" — the numbered eligibility rules are marked below.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Exists, F, OuterRef, Q, QuerySet, Subquery

from hosts.models import Device, DeviceModel

from .models import Attempt, CatalogModel, Job


def devices_live(*, now: datetime) -> QuerySet[Device]:
    """Devices whose machine is connected with a heartbeat under 30 s old (rule 1)."""
    cutoff = now - timedelta(seconds=settings.BALLAST_HEARTBEAT_MAX_AGE_S)
    return Device.objects.filter(
        machine__connected=True, machine__last_heartbeat_at__gt=cutoff
    )


def _loaded(model_id: str) -> Exists:
    return Exists(
        DeviceModel.objects.filter(
            device=OuterRef("pk"), model_id=model_id, loaded=True
        )
    )


def placement_filter(placement: dict) -> Q:
    """The Q of the request's placement requirements (rule 6): gpu, min_vram_gb, region."""
    q = Q()
    if placement.get("gpu"):
        q &= Q(name__icontains=placement["gpu"])
    if placement.get("min_vram_gb") is not None:
        q &= Q(vram_total_mb__gte=int(float(placement["min_vram_gb"]) * 1024))
    if placement.get("region"):
        q &= Q(machine__region__iexact=placement["region"])
    return q


def devices_rented() -> Exists:
    """Exists() of an open (pending or live) rental on the device (rule 5)."""
    from .models import Rental

    return Exists(
        Rental.objects.filter(
            device=OuterRef("pk"),
            status__in=(Rental.Status.PENDING, Rental.Status.LIVE),
        )
    )


def devices_eligible(
    *, job: Job, model: CatalogModel, now: datetime
) -> QuerySet[Device]:
    """Eligible devices for ``job``, in ranking order (best first).

    Rules 1–6 of DESIGN.md "Picking a device"; ranking: score, then the device's
    median time to first token for the model over the last hour (unknown last),
    then random. A spot check runs on its target device whatever its quarantine or
    rental; a rental's job only on the rented device.
    """
    ttft = DeviceModel.objects.filter(device=OuterRef("pk"), model_id=model.id).values(
        "ttft_ms_recent"
    )[:1]
    already_tried = Attempt.objects.filter(job=job, device=OuterRef("pk"))
    devices = devices_live(now=now).filter(  # rule 1
        paused=False,
        machine__paused=False,
        machine__host_paused=False,  # rule 2
    )
    if job.target_device_id:
        devices = devices.filter(id=job.target_device_id)
    if not job.is_spot_check:
        devices = devices.filter(quarantined=False)  # rule 2
        if not job.rental_id:
            devices = devices.filter(  # rule 5: the owner and the agent both accept
                machine__accepts_serverless=True, machine__agent_accepts_serverless=True
            ).exclude(devices_rented())
    return (
        devices.filter(
            slots_used__lt=F("slots_total"),  # rule 3: the coordinator's own claims
            vram_free_mb__gte=model.vram_per_request_mb,  # rule 4
        )
        .filter(_loaded(model.id))  # rule 3
        .filter(
            Q(temp_c__isnull=True) | Q(temp_c__lt=settings.BALLAST_MAX_GPU_TEMP_C)
        )  # rule 4
        .filter(placement_filter(job.placement))  # rule 6
        .exclude(Exists(already_tried))  # rule 6: never the same device twice
        .annotate(ttft_recent=Subquery(ttft))
        .order_by("-score", F("ttft_recent").asc(nulls_last=True), "?")
    )


def requirement_unmet(
    *,
    model: CatalogModel,
    placement: dict,
    now: datetime,
    target_device_id: int | None = None,
) -> str | None:
    """Name the requirement no live device could ever meet, or None if one could.

    Used for the 503 of DESIGN.md "No eligible device": the model loaded nowhere
    live, or a placement requirement nobody live meets (checked in that order).
    """
    live = devices_live(now=now).filter(_loaded(model.id))
    if target_device_id is not None:
        if not live.filter(id=target_device_id).exists():
            return (
                f"the device this job must run on is not live with model '{model.id}'"
            )
        return None
    if not live.exists():
        return f"model '{model.id}' is not loaded on any live device"
    for field in ("gpu", "min_vram_gb", "region"):
        if placement.get(field) in (None, ""):
            continue
        live = live.filter(placement_filter({field: placement[field]}))
        if not live.exists():
            return (
                f"no live device with model '{model.id}' meets placement.{field}="
                f"{placement[field]!r}"
            )
    return None
