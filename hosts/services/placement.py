"""What a device's measured speed allows placement (docs/design-notes.md
"Placement by what was measured"): ``placement.gpu`` and ``min_vram_gb`` match
what Ballast measured of the device, never only what its host declared.

``device_speed_record`` keeps the coordinator's own measure of each succeeded
job (tokens over seconds from the offer to the end) and judges the device on
that model (``catalog.gpus.placement_verdict``); ``device_placement_judge``
judges it again when its ``hello`` declares another name, kind or memory.
``Device.placement_meets`` reads the result.
"""

from __future__ import annotations

from datetime import datetime
from statistics import median

from django.db import transaction
from django.db.models import F

from catalog.gpus import (
    MEASURED_KEPT,
    MEASURED_MIN_JOBS,
    MEASURED_MIN_TOKENS,
    placement_verdict,
)

from ..models import Device, DeviceModel, Measurement


@transaction.atomic(savepoint=False)  # inside a job's end: no savepoint of its own
def device_speed_record(
    *, device_id: int, model_id: str, tokens: int, seconds: float, now: datetime
) -> float | None:
    """Record one succeeded job of ``model_id`` on the device: ``tokens`` the
    coordinator counted (billed) over ``seconds`` from the offer to the end,
    as the coordinator's clock saw them (a host can delay a frame, never hurry
    one: the speed is a bound it cannot raise). Answers under
    ``catalog.gpus.MEASURED_MIN_TOKENS`` tokens, or a non-positive time, are
    not measured (None returned, nothing written).

    Keeps the latest ``MEASURED_KEPT`` measurements per device and model; once
    there are ``MEASURED_MIN_JOBS``, their median is the device's
    ``measured_tokens_per_s`` on the model (a cheat needs most of its jobs fast
    to move it) and the device is judged on it. Returns that median (None
    while too few). Call it after the device's row is locked or updated in
    the same transaction (the claim's lock order: device, then its rows).
    """
    if tokens < MEASURED_MIN_TOKENS or seconds <= 0:
        return None
    Measurement.objects.create(
        device_id=device_id,
        model_id=model_id,
        tokens=tokens,
        seconds=seconds,
        measured_at=now,
    )
    kept = list(
        Measurement.objects.filter(device_id=device_id, model_id=model_id).order_by(
            "-id"
        )[:MEASURED_KEPT]
    )
    if len(kept) == MEASURED_KEPT:
        Measurement.objects.filter(
            device_id=device_id, model_id=model_id, id__lt=kept[-1].id
        ).delete()
    speed = (
        median(m.tokens_per_s for m in kept) if len(kept) >= MEASURED_MIN_JOBS else None
    )
    DeviceModel.objects.filter(device_id=device_id, model_id=model_id).update(
        measured_tokens_per_s=speed, measured_jobs=F("measured_jobs") + 1
    )
    device_placement_judge(device_id=device_id, model_id=model_id)
    return speed


@transaction.atomic
def device_placement_judge(*, device_id: int, model_id: str | None = None) -> None:
    """Judge the device on ``model_id`` (None: on every model it has a row
    of) by its current declaration (name, kind, VRAM) and measured speed:
    ``placed_name`` the device's name and ``placed_vram_mb`` the VRAM credited
    when ``catalog.gpus.placement_verdict`` places it, else '' and 0."""
    device = Device.objects.get(id=device_id)
    rows = DeviceModel.objects.filter(device_id=device_id)
    if model_id is not None:
        rows = rows.filter(model_id=model_id)
    for row in rows:
        verdict = placement_verdict(
            name=device.name,
            kind=device.kind,
            vram_total_mb=device.vram_total_mb,
            model_id=row.model_id,
            tokens_per_s=row.measured_tokens_per_s,
        )
        placed_name = device.name if verdict.placed else ""
        if (row.placed_name, row.placed_vram_mb) != (placed_name, verdict.vram_mb):
            DeviceModel.objects.filter(id=row.id).update(
                placed_name=placed_name, placed_vram_mb=verdict.vram_mb
            )
