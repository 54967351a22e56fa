"""Reads of the catalog: which models exist, which are active, what VRAM they need.

The catalog is small (tens of rows); a request's active model is read with its
API key, by one fixed statement (``jobs.services.keys.api_key_with_model``,
after ``CATALOG_MODEL_ACTIVE``).
"""

from __future__ import annotations

from .models import CatalogModel

CATALOG_MODEL = (CatalogModel, "c")
"""The catalog model in a fixed read (``ballast.rows``): its table's alias ``c``."""
CATALOG_MODEL_ACTIVE = "c.id = %s AND c.active"
"""Which row of ``c`` is the active model of the id given as its one parameter
(the request's key read joins it: ``jobs.services.keys.api_key_with_model``)."""


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
