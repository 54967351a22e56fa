"""Reads behind a machine page's devices: each device's score parts
(DESIGN.md "Reliability score") and what the page shows of it. Sizes MiB;
temperatures °C; times timezone-aware UTC."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db.models import F

from catalog.models import CatalogModel

from ..checkpools import models_unchecked
from ..models import (
    Device,
    DeviceModel,
    DeviceOutcome,
    Machine,
)
from ..scoring import PRIOR, WINDOW, score_parts
from ..services import device_score_inputs, spot_checks_recent


@dataclass
class ScoreParts:
    """The three parts of a device's score (DESIGN.md "Reliability score").

    ``success`` is out of 70, ``uptime`` out of 20, ``latency`` out of 10; ``computed``
    is their sum; with ``outcomes`` < 50 the score leans toward 60 by ``weight``
    (= outcomes/50). ``expected`` is what the score is now (rounded half up).
    """

    outcomes: int
    successes: int
    success: Decimal | None
    uptime: Decimal
    latency: Decimal
    latency_model: str
    computed: Decimal
    weight: Decimal
    expected: int

def device_score_parts(*, device: Device, now: datetime) -> ScoreParts:
    """The score's parts for the device now, from the inputs its stored score is
    computed from (``hosts.services.device_score_inputs``)."""
    inputs = device_score_inputs(device_id=device.id, now=now)
    n = inputs.outcomes
    success, uptime, latency = score_parts(
        outcomes=n,
        successes=inputs.successes,
        online_fraction=inputs.online,
        model_median_ttft_ms=inputs.model_median,
        device_ttft_ms=inputs.device_median,
    )
    return ScoreParts(
        outcomes=n,
        successes=inputs.successes,
        success=success if n else None,
        uptime=uptime,
        latency=latency,
        latency_model=inputs.model_id,
        computed=success + uptime + latency if n else PRIOR,
        weight=Decimal(min(n, WINDOW)) / WINDOW,
        expected=inputs.score,
    )

@dataclass
class DeviceView:
    """A device on the machine page, with what the page shows about it.

    Passed spot checks are not listed (nor counted): a pass at a known time
    would tell the host which of its jobs was a check (DESIGN.md "Spot
    checks"); staff see every check in the admin. ``failed_checks``: its failed
    spot checks, newest first (a failure has consequences the host is told
    of); ``passes_in_a_row``: passed checks since the last failure, shown while
    quarantined (when every job it gets is a check). ``vram_used_pct`` and
    ``temp_pct`` (0–100, of the total VRAM and of ``BALLAST_MAX_GPU_TEMP_C``)
    draw the live gauges; ``hot``: at or over that limit (no new jobs).
    ``unchecked_models``: the models it runs the catalog's weights of that have
    no calibrated spot check yet (``hosts.checkpools``); ``checks_never``: all
    of them, so no check is sent to it (nor can it leave a quarantine).
    """

    device: Device
    loaded_models: list[str]
    parts: ScoreParts | None = None
    failed_checks: list[DeviceOutcome] = field(default_factory=list)
    passes_in_a_row: int = 0
    weights_why: dict[str, str] = field(default_factory=dict)
    unchecked_models: list[str] = field(default_factory=list)
    checks_never: bool = False

    @property
    def loaded_with_why(self) -> list[tuple[str, str]]:
        """Its loaded models, each with why it gets no work of it ('' when it
        runs the catalog's weights: ``CatalogModel.weights_refusal``)."""
        return [(m, self.weights_why.get(m, "")) for m in self.loaded_models]

    @property
    def vram_used_pct(self) -> int | None:
        d = self.device
        if d.vram_free_mb is None or not d.vram_total_mb:
            return None
        used = max(0, d.vram_total_mb - d.vram_free_mb)
        return min(100, round(100 * used / d.vram_total_mb))

    @property
    def vram_used_mb(self) -> int | None:
        d = self.device
        if d.vram_free_mb is None:
            return None
        return max(0, d.vram_total_mb - d.vram_free_mb)

    @property
    def memory_label(self) -> str:
        """Its declared memory as the page shows it: ``"24 GB VRAM"``, or
        ``"24 GB memory"`` for a CPU (its system memory; GB of 1024 MiB)."""
        gb = f"{self.device.vram_total_mb / 1024:.1f}".removesuffix(".0")
        what = "memory" if self.device.kind == Device.Kind.CPU else "VRAM"
        return f"{gb} GB {what}"

    @property
    def measured(self) -> list[DeviceModel]:
        """Its device-model rows with measurements (``measured_jobs`` > 0),
        by model id: each row's ``measured_tokens_per_s``, ``measured_like``
        and ``placement_verdict()`` are what the page lists it as."""
        rows = [dm for dm in self.device.models.all() if dm.measured_jobs]
        return sorted(rows, key=lambda dm: dm.model_id)

    @property
    def temp_pct(self) -> int | None:
        if self.device.temp_c is None:
            return None
        limit = settings.BALLAST_MAX_GPU_TEMP_C
        return max(0, min(100, round(100 * self.device.temp_c / limit)))

    @property
    def hot(self) -> bool:
        temp = self.device.temp_c
        return temp is not None and temp >= settings.BALLAST_MAX_GPU_TEMP_C

def device_views(
    *, machine: Machine, now: datetime, parts: bool = True, failed_checks: int = 20
) -> list[DeviceView]:
    """The machine's devices (retired ones last) with loaded models and, when
    ``parts``, score parts and failed spot checks (the live fragment needs
    neither)."""
    views = []
    catalog = {model.id: model for model in CatalogModel.objects.all()}
    devices = machine.devices.prefetch_related("models").order_by(
        F("retired_at").asc(nulls_first=True), "index"
    )
    for device in devices:
        recent = spot_checks_recent(device_id=device.id) if parts else []
        weights_why = {
            dm.model_id: catalog[dm.model_id].weights_refusal(
                dm.weights_sha256, dm.weights_quantization
            )
            for dm in device.models.all()
            if dm.loaded and dm.model_id in catalog
        }
        runnable = [model_id for model_id, why in weights_why.items() if not why]
        unchecked = models_unchecked(runnable) if parts else []
        views.append(
            DeviceView(
                device=device,
                loaded_models=sorted(
                    dm.model_id for dm in device.models.all() if dm.loaded
                ),
                weights_why=weights_why,
                unchecked_models=unchecked,
                checks_never=bool(unchecked) and len(unchecked) == len(runnable),
                parts=device_score_parts(device=device, now=now) if parts else None,
                failed_checks=list(
                    DeviceOutcome.objects.filter(
                        device=device,
                        source=DeviceOutcome.Source.SPOT_CHECK,
                        success=False,
                    )[:failed_checks]
                )
                if parts
                else [],
                passes_in_a_row=next(
                    (i for i, passed in enumerate(recent) if not passed), len(recent)
                ),
            )
        )
    return views
