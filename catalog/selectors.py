"""Reads of the catalog: which models exist, which are active, what VRAM they need.

The catalog is small (tens of rows); the active model is read on every request
(one fixed statement).
"""

from __future__ import annotations

from django.db import connection

from ballast.rows import columns, instances

from .models import CatalogModel


def catalog_model_active(*, model_id: str) -> CatalogModel | None:
    """The active catalog model ``model_id``, or None (unknown or inactive)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {columns(CATALOG_MODEL)} FROM jobs_catalogmodel c"
            f" WHERE {CATALOG_MODEL_ACTIVE}",
            [model_id],
        )
        row = cursor.fetchone()
    return None if row is None else instances(row, CATALOG_MODEL)[0]


CATALOG_MODEL = (CatalogModel, "c")
"""The catalog model in a fixed read (``ballast.rows``): its table's alias ``c``."""
CATALOG_MODEL_ACTIVE = "c.id = %s AND c.active"
"""Which row of ``c`` is the active model of the id given as its one parameter:
every read of a request's model says it so (``catalog_model_active``, the
request's key read: ``jobs.services.keys.api_key_authenticate``)."""


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
