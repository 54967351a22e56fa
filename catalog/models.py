"""The catalog: the models renters may ask for, their sizes and prices.

Money is integer nano-USD (``billing.money``).
"""

from __future__ import annotations

from django.db import models


class CatalogModel(models.Model):
    """A model of the catalog: id, family, context length, VRAM estimate, price.

    Prices are integer nano-USD per token (1 USD = 10**9). ``vram_per_request_mb``
    is a catalog *estimate* (MiB), used by eligibility rule 4. ``id`` is what jobs
    and device models name in ``model_id`` (a plain column, not a foreign key).
    """

    id = models.CharField(primary_key=True, max_length=100)
    family = models.CharField(max_length=64)
    context_length = models.PositiveIntegerField()
    vram_per_request_mb = models.PositiveIntegerField()
    price_prompt_nano = models.BigIntegerField(default=0)
    price_completion_nano = models.BigIntegerField()
    active = models.BooleanField(default=True)

    class Meta:
        # the table kept its name when the model left the jobs app (no data moved)
        db_table = "jobs_catalogmodel"
        ordering = ["id"]

    def __str__(self) -> str:
        return self.id
