"""What a renter choosing a model wants to know (issue 35 item 3), one reading
for ``GET /v1/models`` and the public models page: price per million tokens
in and out, context length, live capacity, and how fast the fleet served it.

Speeds are the coordinator's own measures, never a host's word: the time to
first token of succeeded attempts (offer to first token, the outcomes the
score reads) and tokens per second from offer to answer
(``hosts.Measurement``), each the median over ``WINDOW`` (at most
``SAMPLES`` of the latest), None without any.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from catalog.models import CatalogModel
from hosts.models import DeviceOutcome, Measurement

from .selectors import model_capacity

WINDOW = timedelta(hours=24)
SAMPLES = 1000
MILLION = 1_000_000


@dataclass(frozen=True)
class ModelFacts:
    """A catalog model as renters compare them. ``prompt_per_million_nano`` and
    ``completion_per_million_nano``: price of a million tokens (nano-USD);
    ``devices_online``, ``slots_free``: ``selectors.model_capacity``;
    ``ttft_ms``: median time to first token (ms), ``tokens_per_s``: median
    output tokens per second, each over ``WINDOW`` (None when nothing was
    measured), from ``ttft_samples`` and ``speed_samples`` measures."""

    model: CatalogModel
    prompt_per_million_nano: int
    completion_per_million_nano: int
    devices_online: int
    slots_free: int
    ttft_ms: int | None
    tokens_per_s: Decimal | None
    ttft_samples: int
    speed_samples: int


def model_facts(*, model: CatalogModel, now: datetime) -> ModelFacts:
    """``model``'s ``ModelFacts`` at ``now`` (three queries and the capacity's)."""
    since = now - WINDOW
    ttfts = list(
        DeviceOutcome.objects.filter(
            model_id=model.id,
            success=True,
            ttft_ms__isnull=False,
            created_at__gte=since,
        )
        .order_by("-created_at")
        .values_list("ttft_ms", flat=True)[:SAMPLES]
    )
    speeds = [
        tokens / seconds
        for tokens, seconds in Measurement.objects.filter(
            model_id=model.id, measured_at__gte=since, seconds__gt=0
        )
        .order_by("-measured_at")
        .values_list("tokens", "seconds")[:SAMPLES]
    ]
    capacity = model_capacity(model_id=model.id, now=now)
    return ModelFacts(
        model=model,
        prompt_per_million_nano=model.price_prompt_nano * MILLION,
        completion_per_million_nano=model.price_completion_nano * MILLION,
        devices_online=capacity["devices_online"],
        slots_free=capacity["slots_free"],
        ttft_ms=round(statistics.median(ttfts)) if ttfts else None,
        tokens_per_s=(
            Decimal(str(round(statistics.median(speeds), 1))) if speeds else None
        ),
        ttft_samples=len(ttfts),
        speed_samples=len(speeds),
    )


def models_facts(*, now: datetime) -> list[ModelFacts]:
    """Every active catalog model's ``ModelFacts``, by id."""
    return [
        model_facts(model=model, now=now)
        for model in CatalogModel.objects.filter(active=True).order_by("id")
    ]
