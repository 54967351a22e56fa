"""Which models can be spot-checked, and what a device's models lack for it
(issue 31 item 4: a device whose model has no calibrated check is shown so,
never silently unchecked).

A model *has calibrated checks* when its pool holds at least one calibrated
prompt (``CanaryPrompt`` ``calibrated``: its right answer established by the
reference engine or by the fleet, ``trust.canaryfleet``), or this
coordinator runs its reference engine (``trust.canarypool.reference_engine``),
which calibrates the pool on the next top-up. A device is checkable when one
of its loaded models whose pinned weights it runs has calibrated checks: a
spot check of it is then sent, or waits for the top-up
(``trust.spotchecks.spot_checks_take_due``); otherwise the check is dropped
(logged and counted: ``ballast.metrics.spot_check_dropped``), a rental of it
is refused (``jobs.rentals.rental_create``) and its machine page says why
(``hosts.checkpools``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import Count, Q

from catalog.models import CatalogModel
from hosts.models import DeviceModel
from jobs.models import CanaryPrompt

from .canarypool import reference_engine_kept
from .verification.calibration import CalibrationState, calibration_state
from .verification.verifiers import verifiers_eligible


def models_checked(model_ids: Iterable[str]) -> set[str]:
    """Of ``model_ids``, those that have calibrated checks (module docstring).
    One query for the pools; the reference engines are asked once per model
    per process (``trust.canarypool.reference_engine_kept``)."""
    ids = set(model_ids)
    pooled = set(
        CanaryPrompt.objects.filter(
            model_id__in=ids, status=CanaryPrompt.Status.CALIBRATED
        )
        .values_list("model_id", flat=True)
        .distinct()
    )
    return pooled | {m for m in ids - pooled if reference_engine_kept(m)}


def device_models_runnable(*, device_id: int) -> list[str]:
    """The device's loaded models whose pinned weights it runs (those it can
    be sent work, and so checks, of: DESIGN.md "Picking a device" rule 6), by id."""
    rows = DeviceModel.objects.filter(device_id=device_id, loaded=True).values_list(
        "model_id", "weights_sha256"
    )
    ids = [model_id for model_id, _ in rows]
    catalog = {m.id: m for m in CatalogModel.objects.filter(id__in=ids)}
    return sorted(
        model_id
        for model_id, weights in rows
        if model_id in catalog and catalog[model_id].weights_match(weights)
    )


def device_checks_missing(*, device_id: int) -> list[str]:
    """The models the device cannot be spot-checked on for want of calibrated
    checks: [] when one of its runnable models has them (it is checked through
    that one), else its runnable models (all unchecked), by id."""
    runnable = device_models_runnable(device_id=device_id)
    return [] if models_checked(runnable) else runnable


@dataclass(frozen=True)
class CheckSupply:
    """What a model has to check its hosts with now (the staff fleet page):
    ``checked``: it has calibrated checks (``models_checked``);
    ``checks_unused`` calibrated prompts never sent, of ``checks_calibrated``
    in its pool; ``reference_engine``: this coordinator calibrates its pool;
    ``checks_of_verifiers``: calibrated prompts made checks of verifiers (a
    reference answer and a decoy judged at a temperature: its verification
    is calibrated); ``verifiers``: devices that may verify its answers now,
    ``verifiers_trusted`` of them passed ``BALLAST_VERIFIER_TRUST_PASSES``
    checks of verifiers (``trust.verification.verifiers.verifiers_eligible``);
    ``calibration``: its verification's thresholds, calibrated for its pinned
    weights or not, and the honest samples kept
    (``trust.verification.calibration.calibration_state``)."""

    checked: bool
    checks_unused: int
    checks_calibrated: int
    reference_engine: bool
    checks_of_verifiers: int
    verifiers: int
    verifiers_trusted: int
    calibration: CalibrationState

    @property
    def verification_calibrated(self) -> bool:
        """Whether its answers are verified (judged by its own thresholds)."""
        return self.calibration.calibrated


def check_supply(*, model: CatalogModel, now: datetime) -> CheckSupply:
    """The model's ``CheckSupply`` now (seven queries)."""
    calibrated = Q(status=CanaryPrompt.Status.CALIBRATED)
    pool = CanaryPrompt.objects.filter(calibrated, model_id=model.id).aggregate(
        calibrated=Count("id"),
        unused=Count("id", filter=Q(sent_count=0)),
        checks=Count("id", filter=Q(check_temperature__isnull=False)),
    )
    verifiers = verifiers_eligible(model=model, now=now).values("id").distinct()
    trusted = verifiers.filter(
        verifier_passes__gte=settings.BALLAST_VERIFIER_TRUST_PASSES
    )
    return CheckSupply(
        checked=model.id in models_checked([model.id]),
        checks_unused=pool["unused"],
        checks_calibrated=pool["calibrated"],
        reference_engine=reference_engine_kept(model.id),
        checks_of_verifiers=pool["checks"],
        verifiers=verifiers.count(),
        verifiers_trusted=trusted.count(),
        calibration=calibration_state(model=model),
    )
