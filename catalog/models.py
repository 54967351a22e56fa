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


class ModelData(models.Model):
    """What the coordinator keeps of a catalog model's GGUF file to tokenize and
    render prompts as hosts do, never the weights (issue 31 item 3).

    ``vocab_json`` is ``modeldata.VocabData.to_json()`` of the file: its
    tokenizer (tokens, types, scores, merges), special tokens and chat template
    (about 1.3 MB for SmolLM2, up to a few MB for a 256k-token vocabulary).
    Written by ``catalog.modeldata.model_data_save``; read once per process by
    ``catalog.modeldata.model_tokenizer``. A model without a row has no
    tokenizer on the coordinator (counts fall back to the host's word capped by
    characters, DESIGN.md "Money").
    """

    model = models.OneToOneField(
        CatalogModel, primary_key=True, on_delete=models.CASCADE, related_name="data"
    )
    vocab_json = models.TextField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "model data"
        verbose_name_plural = "model data"

    def __str__(self) -> str:
        return f"data of {self.model_id}"
