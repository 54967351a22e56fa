"""Reads of the catalog: which models exist, which are active, what VRAM they need.

Every function is a plain ORM read; the catalog is small (tens of rows).
"""

from __future__ import annotations

from .models import CatalogModel


def catalog_model_active(*, model_id: str) -> CatalogModel | None:
    """The active catalog model ``model_id``, or None (unknown or inactive)."""
    return CatalogModel.objects.filter(id=model_id, active=True).first()


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
