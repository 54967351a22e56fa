"""Verification's thresholds per catalog entry, from honest answers (DESIGN.md
"Verifying real answers": what honest answers score is calibrated per model
and quantization; issue 31 item 4).

An entry is *calibrated* when it has a ``trust.models.ModelCalibration`` for
the weights it pins now (``calibration_of``). SmolLM2-135M-Instruct Q4_1's
is the reference model's (``plausibility.REFERENCE_THRESHOLDS``, written by
``trust`` migration 0001). Any other entry's comes from the fleet: while it
has none, an answer of its drawn for verification (``records.
verification_choose``) is

- a *sample* when its device is trusted (``trusted.devices_trusted``:
  staff's reference device or an established clean record): scored by a
  trusted verifier of another owner, its statistics kept
  (``CalibrationSample``), nothing judged, nothing follows for anyone;
- otherwise *uncalibrated*: not verified, recorded as such
  (``Verification.Status.UNCALIBRATED``), never judged against another
  model's thresholds.

Once ``SAMPLES_GREEDY`` greedy and ``SAMPLES_SAMPLED`` sampled samples (at
temperatures from ``Z_RANGE[0]`` to ``Z_RANGE[1]``, of at least
``plausibility.Z_MIN_TOKENS`` tokens) are kept for the entry's weights, its
thresholds are derived (``thresholds_derive``) and its verification judges
from then on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction

from ballast.rows import columns, instances
from catalog.models import CatalogModel
from jobs.models import Attempt, Job, Verification

from ..trusted import devices_trusted
from ..models import CalibrationSample, ModelCalibration
from .verifiers import verification_open
from .plausibility import (
    GREEDY_MISSES_BASE,
    GREEDY_MISSES_SHARE,
    OUTSIDE_BASE,
    OUTSIDE_SHARE,
    Z_MIN,
    Z_MIN_TOKENS,
    AnswerStats,
    Thresholds,
)

SAMPLES_GREEDY = 15
"""Honest greedy answers (temperature 0) an entry needs to be calibrated."""
SAMPLES_SAMPLED = 15
"""Honest sampled answers (within ``Z_RANGE``, of at least ``Z_MIN_TOKENS``
tokens) an entry needs to be calibrated."""
Z_RANGE = (0.5, 1.0)
"""The widest temperatures z may judge (z came within 0.01 of the threshold
for honest SmolLM2 answers at T 0.1: ``plausibility.Z_TEMPERATURES``)."""
Z_MARGIN = 1.5
"""How far below the lowest honest z the threshold sits, at least."""
MISSES_FACTOR = 2.0
"""The greedy-miss share allowed is this many times the largest honest one."""


@dataclass(frozen=True)
class Sample:
    """One honest answer's statistics at ``temperature`` (0: greedy)."""

    temperature: float
    n: int
    z: float
    misses: int
    outside: int


def thresholds_derive(samples: Iterable[Sample]) -> Thresholds | None:
    """An entry's thresholds from its honest ``samples`` (pure); None until
    there are ``SAMPLES_GREEDY`` greedy and ``SAMPLES_SAMPLED`` sampled ones.
    Each tolerance covers every sample, and is never tighter than SmolLM2's
    (``plausibility``'s constants, where SmolLM2's honest answers fell):

    - outside the support: ``OUTSIDE_SHARE`` × n plus the base, one token
      more than the most any sample had over that share (at least
      ``OUTSIDE_BASE``);
    - greedy misses: ``GREEDY_MISSES_BASE`` plus a share of n,
      ``MISSES_FACTOR`` times the largest share of a greedy sample (at least
      ``GREEDY_MISSES_SHARE``: another device's arithmetic flips near-ties);
    - z: ``Z_MARGIN`` below the lowest sampled z (at most ``Z_MIN``), judged
      from the lowest to the highest sampled temperature within ``Z_RANGE``.
    """
    samples = list(samples)
    greedy = [s for s in samples if s.temperature <= 0 and s.n > 0]
    sampled = [
        s
        for s in samples
        if Z_RANGE[0] <= s.temperature <= Z_RANGE[1] and s.n >= Z_MIN_TOKENS
    ]
    if len(greedy) < SAMPLES_GREEDY or len(sampled) < SAMPLES_SAMPLED:
        return None
    over = max(math.ceil(s.outside - OUTSIDE_SHARE * s.n) for s in samples if s.n)
    miss_share = max((s.misses - GREEDY_MISSES_BASE) / s.n for s in greedy)
    return Thresholds(
        greedy_misses_base=GREEDY_MISSES_BASE,
        greedy_misses_share=max(GREEDY_MISSES_SHARE, MISSES_FACTOR * miss_share),
        outside_base=max(OUTSIDE_BASE, over + 1),
        outside_share=OUTSIDE_SHARE,
        z_min=min(Z_MIN, min(s.z for s in sampled) - Z_MARGIN),
        z_low=min(s.temperature for s in sampled),
        z_high=max(s.temperature for s in sampled),
    )


def calibration_of(model: CatalogModel) -> ModelCalibration | None:
    """``model``'s calibration for the weights it pins now (its catalog row's,
    read with it), else None. One fixed statement (``_pinned_calibration``)."""
    return _pinned_calibration(model.id)


def thresholds_of(model_id: str) -> Thresholds | None:
    """The thresholds verification judges ``model_id``'s answers by, or None
    when the entry is not calibrated (or not in the catalog): such an answer
    is not judged. One fixed statement."""
    calibration = _pinned_calibration(model_id)
    return calibration.thresholds if calibration is not None else None


_CALIBRATION = ((ModelCalibration, "k"),)


def _pinned_calibration(model_id: str) -> ModelCalibration | None:
    """The calibration of catalog entry ``model_id`` for the weights and
    quantization the entry pins now (none for weights it no longer pins, nor
    for an entry not in the catalog): the entry's row joined to its
    calibration in one fixed statement (``ballast.rows``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {columns(*_CALIBRATION)} FROM jobs_catalogmodel c"
            " JOIN trust_modelcalibration k ON k.model_id = c.id"
            " AND k.weights_sha256 = c.weights_sha256"
            " AND k.quantization = c.quantization WHERE c.id = %s",
            [model_id],
        )
        row = cursor.fetchone()
    return None if row is None else instances(row, *_CALIBRATION)[0]


def samples_of(model: CatalogModel) -> list[Sample]:
    """The honest samples kept for ``model``'s pinned weights."""
    rows = CalibrationSample.objects.filter(
        model=model,
        weights_sha256=model.weights_sha256,
        quantization=model.quantization,
    ).values_list("temperature", "n", "z", "misses", "outside")
    return [Sample(*row) for row in rows]


def sample_open(*, job: Job, attempt: Attempt, now: datetime) -> Verification:
    """Round 1 of a drawn answer of a model that is not calibrated
    (``records.verification_choose``): a ``sample`` offered to a trusted
    verifier of another owner when ``attempt``'s device is trusted now
    (``trusted.devices_trusted``; ``no_verifier`` when none is), else
    ``uncalibrated``: not verified, nothing offered. Never judged."""
    model = CatalogModel.objects.get(id=job.model_id)
    trusted = devices_trusted(model=model, now=now)
    if trusted.filter(id=attempt.device_id).exists():
        return verification_open(
            job=job,
            attempt=attempt,
            round=1,
            now=now,
            among=trusted,
            verdict=Verification.Verdict.SAMPLE,
        )
    return Verification.objects.create(
        job=job,
        attempt=attempt,
        device_id=attempt.device_id,
        round=1,
        status=Verification.Status.UNCALIBRATED,
        offered_at=now,
        detail=f"not verified: verification of {model.id} is not calibrated yet",
    )


@transaction.atomic
def calibration_set(
    *,
    model: CatalogModel,
    thresholds: Thresholds,
    samples: int,
    source: str,
    now: datetime,
) -> ModelCalibration:
    """Store ``thresholds`` as ``model``'s calibration for the weights it pins
    now (replacing any), from ``samples`` honest answers of ``source``
    (``ModelCalibration.Source``). The one place a calibration is written."""
    fields = {
        "weights_sha256": model.weights_sha256,
        "quantization": model.quantization,
        "greedy_misses_base": thresholds.greedy_misses_base,
        "greedy_misses_share": thresholds.greedy_misses_share,
        "outside_base": thresholds.outside_base,
        "outside_share": thresholds.outside_share,
        "z_min": thresholds.z_min,
        "z_low": thresholds.z_low,
        "z_high": thresholds.z_high,
        "samples": samples,
        "source": source,
        "calibrated_at": now,
    }
    return ModelCalibration.objects.update_or_create(model=model, defaults=fields)[0]


def calibration_sample_add(
    *, ver: Verification, stats: AnswerStats, temperature: float, now: datetime
) -> ModelCalibration | None:
    """Keep the scored sample ``ver`` (``stats`` at the job's ``temperature``)
    for its model's pinned weights and, while the entry is not calibrated,
    derive its thresholds once enough are kept (``thresholds_derive``).
    Returns the calibration made now, else None. Runs in the caller's
    transaction (``records.verification_scored``); the entry's row is locked
    so two samples at once calibrate it once."""
    model = CatalogModel.objects.select_for_update().get(id=ver.job.model_id)
    CalibrationSample.objects.create(
        model=model,
        weights_sha256=model.weights_sha256,
        quantization=model.quantization,
        verification=ver,
        temperature=temperature,
        n=stats.n,
        z=stats.z,
        misses=stats.misses,
        outside=stats.outside,
        created_at=now,
    )
    if calibration_of(model) is not None:
        return None
    samples = samples_of(model)
    thresholds = thresholds_derive(samples)
    if thresholds is None:
        return None
    return calibration_set(
        model=model,
        thresholds=thresholds,
        samples=len(samples),
        source=ModelCalibration.Source.FLEET,
        now=now,
    )


@dataclass(frozen=True)
class CalibrationState:
    """What staff see of an entry's verification calibration: ``calibrated``
    (for its pinned weights), ``source`` ("" when not), ``samples`` honest
    answers kept for its weights, of which ``greedy`` and ``sampled`` count
    towards ``SAMPLES_GREEDY`` and ``SAMPLES_SAMPLED``; ``unverified``
    answers drawn while it was not (``Verification.Status.UNCALIBRATED``)."""

    calibrated: bool
    source: str
    samples: int
    greedy: int
    sampled: int
    unverified: int
    greedy_needed: int = SAMPLES_GREEDY
    sampled_needed: int = SAMPLES_SAMPLED


def calibration_state(*, model: CatalogModel) -> CalibrationState:
    """``model``'s ``CalibrationState`` (three queries)."""
    calibration = calibration_of(model)
    samples = samples_of(model)
    return CalibrationState(
        calibrated=calibration is not None,
        source=calibration.source if calibration is not None else "",
        samples=calibration.samples if calibration is not None else len(samples),
        greedy=sum(1 for s in samples if s.temperature <= 0 and s.n > 0),
        sampled=sum(
            1
            for s in samples
            if Z_RANGE[0] <= s.temperature <= Z_RANGE[1] and s.n >= Z_MIN_TOKENS
        ),
        unverified=Verification.objects.filter(
            job__model_id=model.id, status=Verification.Status.UNCALIBRATED
        ).count(),
    )
