"""Reads behind a machine page's history: its recent jobs and rentals,
benchmarks, earnings per day and score samples. Amounts are integer nano-USD;
times timezone-aware UTC."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Sum
from django.db.models.functions import TruncDate

from billing.models import Earning
from catalog.models import CatalogModel

from ..models import (
    Benchmark,
    Machine,
    ScoreSample,
)
from ..segments import segment_earned_nothing


def machine_attempts(*, machine: Machine, limit: int = 25) -> list:
    """The machine's most recent attempts (``jobs``' rows, read through each
    device's ``attempts``), newest first, with their job, device, earning and
    receipt check, each with ``why_nothing``: why it earned nothing
    (``hosts.segments.segment_earned_nothing``), or None."""
    attempts = [
        attempt
        for device in machine.devices.all()
        for attempt in device.attempts.select_related(
            "job", "device__machine", "earning", "receipt_check"
        ).order_by("-offered_at")[:limit]
    ]
    attempts.sort(key=lambda attempt: attempt.offered_at, reverse=True)
    attempts = attempts[:limit]
    for attempt in attempts:
        attempt.why_nothing = segment_earned_nothing(attempt)
    return attempts

def machine_rentals(*, machine: Machine, limit: int = 10) -> list:
    """The latest rentals of the machine's devices (``jobs``' rows, read through
    each device's ``rentals``), newest first, with their device and ``earned``:
    the owner's earnings from each, nano-USD. Their ``status`` and
    ``stop_reason`` say why one ended early (a failed spot check, its device
    away too long: ``jobs.rentals.rentals_watch``)."""
    rentals = [
        rental
        for device in machine.devices.all()
        for rental in device.rentals.select_related("device__machine").order_by(
            "-created_at"
        )[:limit]
    ]
    rentals.sort(key=lambda rental: rental.created_at, reverse=True)
    rentals = rentals[:limit]
    earned = dict(
        Earning.objects.filter(rental_id__in=[r.id for r in rentals])
        .values_list("rental_id")
        .annotate(total=Sum("amount_nano"))
    )
    for rental in rentals:
        rental.earned = earned.get(rental.id, 0)
    return rentals

@dataclass
class BenchmarkRow:
    """A benchmark on this hardware beside the catalog's VRAM estimate (MiB)."""

    benchmark: Benchmark
    catalog_vram_estimate_mb: int | None

def machine_benchmarks(*, machine: Machine, limit: int = 20) -> list[BenchmarkRow]:
    """Recent benchmarks of the machine's devices, each with the catalog's estimate."""
    benchmarks = list(
        Benchmark.objects.filter(device__machine=machine).select_related("device")[
            :limit
        ]
    )
    estimates = dict(
        CatalogModel.objects.filter(
            id__in={b.model_id for b in benchmarks}
        ).values_list("id", "vram_per_request_mb")
    )
    return [BenchmarkRow(b, estimates.get(b.model_id)) for b in benchmarks]

def machine_earnings_daily(
    *, machine: Machine, now: datetime, days: int = 14
) -> list[tuple]:
    """Per day of the last ``days`` (oldest first): (date, nano-USD earned, not reversed)."""
    start = (now - timedelta(days=days - 1)).date()
    rows = (
        Earning.objects.filter(device__machine=machine, created_at__date__gte=start)
        .exclude(status=Earning.Status.REVERSED)
        .annotate(day=TruncDate("created_at"))
        .values("day")
        .annotate(total=Sum("amount_nano"))
    )
    totals = {row["day"]: row["total"] or 0 for row in rows}
    return [
        (start + timedelta(days=i), totals.get(start + timedelta(days=i), 0))
        for i in range(days)
    ]

SCORE_HISTORY = timedelta(days=7)  # what the machine page's score chart spans

def machine_score_history(*, machine: Machine, now: datetime) -> dict:
    """Map device label → [(taken_at, score)] over the last ``SCORE_HISTORY``,
    oldest first."""
    samples = ScoreSample.objects.filter(
        device__machine=machine, taken_at__gte=now - SCORE_HISTORY
    ).select_related("device", "device__machine")
    history: dict[str, list] = {}
    for sample in samples:
        history.setdefault(sample.device.label, []).append(
            (sample.taken_at, sample.score)
        )
    return history
