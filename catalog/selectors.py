"""Reads of the catalog: which models exist, which are active, what VRAM they need.

The catalog is small (tens of rows); the active model is read on every request
(one fixed statement).
"""

from __future__ import annotations

from .models import CatalogModel


def catalog_model_active(*, model_id: str) -> CatalogModel | None:
    """The active catalog model ``model_id``, or None (unknown or inactive)."""
    rows = CatalogModel.objects.raw(
        "SELECT * FROM jobs_catalogmodel WHERE id = %s AND active", [model_id]
    )
    return next(iter(rows), None)


def catalog_model_ids() -> frozenset[str]:
    """The ids of the catalog's models, active or not."""
    return frozenset(CatalogModel.objects.values_list("id", flat=True))


def catalog_vram_needs_mb() -> tuple[int, ...]:
    """The catalog models' distinct per-request VRAM needs (MiB), ascending.

    Used to coalesce telemetry: a device's free VRAM crossing one of these
    thresholds changes which models it can serve (eligibility rule 4).
    """
    return tuple(
        sorted(set(CatalogModel.objects.values_list("vram_per_request_mb", flat=True)))
    )
