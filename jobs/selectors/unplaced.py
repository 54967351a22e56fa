"""Why no device can take a request: the 503 of DESIGN.md "No eligible device"
(503 only when no live device could ever serve it). ``devices_untried_exist``
(a live device with the model, meeting the placement, not yet tried: wait),
``requirement_unmet`` (the requirement no live device meets: the model loaded
nowhere live, a placement field, an output feature, named as the request asks
it: ``FEATURE_FIELDS``) and ``_unplaced_why`` (a declared device Ballast does
not place there: ``catalog.gpus.placement_verdict``).
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Exists, OuterRef, QuerySet

from catalog.gpus import placement_verdict
from catalog.models import CatalogModel
from hosts.models import Device, DeviceModel, vram_need_mb

from ..models import Attempt, Job
from .eligibility import devices_live, features_filter, model_loaded, placement_filter


def devices_untried_exist(*, job: Job, model: CatalogModel, now: datetime) -> bool:
    """True when a live device with the model, meeting the placement, has not yet
    had an attempt of ``job`` (busy, hot, paused or quarantined ones count: they
    may free up, or leave quarantine after three passed spot checks; DESIGN.md
    "No eligible device": 503 only when no live device could ever serve it)."""
    devices = devices_live(now=now).filter(model_loaded(model))
    if job.target_device_id:
        devices = devices.filter(id=job.target_device_id)
    return (
        devices.filter(placement_filter(job.placement, model_id=model.id))
        .filter(features_filter(job.features_needed))
        .exclude(Exists(Attempt.objects.filter(job=job, device=OuterRef("pk"))))
        .exists()
    )


def requirement_unmet(
    *,
    model: CatalogModel,
    placement: dict,
    now: datetime,
    target_device_id: int | None = None,
    features: tuple[str, ...] = (),
) -> str | None:
    """Name the requirement no live device could ever meet, or None if one could.

    Used for the 503 of DESIGN.md "No eligible device": the model loaded nowhere
    live, a placement requirement nobody live meets, or a feature of the output
    (``features``: ``Job.features_needed``) no live device's engine declared,
    checked in that order (the feature named as the request's field asks it:
    ``FEATURE_FIELDS``).
    """
    live = devices_live(now=now).filter(model_loaded(model))
    if target_device_id is not None:
        live = live.filter(id=target_device_id)
        if not live.exists():
            return (
                f"the device this job must run on is not live with model '{model.id}'"
            )
    elif not live.exists():
        if (
            devices_live(now=now)
            .filter(models__model_id=model.id, models__loaded=True)
            .exists()
        ):
            return (
                f"no live device runs the catalog's weights of model '{model.id}'"
                f" ({model.quantization or 'sha256'} {model.weights_sha256[:12]}…)"
            )
        return f"model '{model.id}' is not loaded on any live device"
    for field in ("gpu", "min_vram_gb", "region"):
        if target_device_id is not None or placement.get(field) in (None, ""):
            continue
        declared = live
        live = live.filter(
            placement_filter({field: placement[field]}, model_id=model.id)
        )
        if not live.exists():
            return (
                f"no live device with model '{model.id}' meets placement.{field}="
                f"{placement[field]!r}"
                + _unplaced_why(
                    declared, field=field, value=placement[field], model=model
                )
            )
    for feature in features:
        live = live.filter(features_filter([feature]))
        if not live.exists():
            where = (
                "the device this job must run on does not"
                if target_device_id is not None
                else f"no live device with model '{model.id}' can"
            )
            return (
                f"{where} serve {FEATURE_FIELDS[feature]} (its engine must "
                f"declare the feature '{feature}')"
            )
    return None


def _unplaced_why(
    devices: QuerySet[Device], *, field: str, value, model: CatalogModel
) -> str:
    """For a 503 on ``placement.gpu`` or ``min_vram_gb``: when one of
    ``devices`` declares what was asked, why Ballast does not place it there
    (``catalog.gpus.placement_verdict``: a CPU, not measured yet, measured
    slower than its declared class, or credited less VRAM), as a clause; ''
    when none declares it or ``field`` is ``region``."""
    if field == "gpu":
        declared = devices.filter(name__icontains=value)
    elif field == "min_vram_gb":
        declared = devices.filter(vram_total_mb__gte=vram_need_mb(value))
    else:
        return ""
    device = declared.order_by("id").first()
    if device is None:
        return ""
    row = DeviceModel.objects.filter(device=device, model_id=model.id).first()
    verdict = placement_verdict(
        name=device.name,
        kind=device.kind,
        vram_total_mb=device.vram_total_mb,
        model_id=model.id,
        tokens_per_s=row.measured_tokens_per_s if row else None,
    )
    if verdict.why:
        why = verdict.why
    elif field == "min_vram_gb":
        why = f"a {verdict.gpu_class.name} is credited at most {verdict.vram_mb} MiB"
    else:
        why = "not judged yet under its current name"
    return (
        f": placement is by what Ballast measured, not what a host declares"
        f" (a live device declaring it: {why})"
    )


# how a 503 names each feature: as the request's field asks for it
FEATURE_FIELDS = {
    "json_object": "response_format json_object",
    "json_schema": "response_format json_schema or tools (function calling)",
    "json_sequence": "tools (function calling) in the model's own tool-call format",
    "logprobs": "logprobs",
    "token_ids": "a temperature above 1 (an engine that reports its token ids)",
}
