"""The catalog: the models renters may ask for, their sizes and prices.

Money is integer nano-USD (``billing.money``).
"""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models

sha256_hex_validator = RegexValidator(
    r"^([0-9a-f]{64})?$", "a sha256 digest is 64 lowercase hex digits"
)


class CatalogModel(models.Model):
    """A model of the catalog: id, family, context length, VRAM estimate, price,
    and the weights hosts must run (DESIGN.md "Models (the catalog)").

    Prices are integer nano-USD per token (1 USD = 10**9). ``vram_per_request_mb``
    is a catalog *estimate* (MiB) of one request's context (KV cache and output
    buffers), used by eligibility rule 4; ``vram_weights_mb`` an estimate of the
    weights'. ``id`` is what jobs and device models name in ``model_id`` (a
    plain column, not a foreign key).

    What pins the weights, read from the GGUF file by ``catalog_add``
    (``catalog.services.catalog_model_add``): ``weights_sha256``, the hex
    sha256 of the file ("" pins nothing: any device listing the model is
    eligible); ``quantization``, llama.cpp's name of its file type ("Q4_1");
    ``special_tokens``, ``{"bos": {"id": 1, "text": "<|im_start|>"}, ...}``;
    ``tool_call_format``, how its chat template writes tool calls ("" when it
    has none: ``modeldata.entry.TOOL_CALL_FORMATS``).
    """

    id = models.CharField(primary_key=True, max_length=100)
    family = models.CharField(max_length=64)
    context_length = models.PositiveIntegerField()
    vram_per_request_mb = models.PositiveIntegerField()
    price_prompt_nano = models.BigIntegerField(default=0)
    price_completion_nano = models.BigIntegerField()
    active = models.BooleanField(default=True)
    weights_sha256 = models.CharField(
        max_length=64,
        blank=True,
        default="",
        db_default="",
        validators=[sha256_hex_validator],
        help_text="hex sha256 of the GGUF file hosts must run ('' pins nothing)",
    )
    quantization = models.CharField(
        max_length=32, blank=True, default="", db_default="", help_text="e.g. Q4_1"
    )
    special_tokens = models.JSONField(default=dict, blank=True)
    tool_call_format = models.CharField(
        max_length=32,
        blank=True,
        default="",
        db_default="",
        help_text="how its chat template writes tool calls ('' when it has none)",
    )
    vram_weights_mb = models.PositiveIntegerField(
        default=0, db_default=0, help_text="estimate of the weights' VRAM (MiB)"
    )

    class Meta:
        # the table kept its name when the model left the jobs app (no data moved)
        db_table = "jobs_catalogmodel"
        ordering = ["id"]

    def __str__(self) -> str:
        return self.id

    def weights_match(self, declared: str) -> bool:
        """Whether a device declaring ``declared`` (hex sha256 of the file its
        engine loaded, "" when its agent said none) runs this entry's weights:
        the entry pins none, or the digests are equal (DESIGN.md "Picking a
        device" rule 6; ``jobs.selectors.devices_eligible`` is the same rule
        in SQL)."""
        return not self.weights_sha256 or declared == self.weights_sha256

    def weights_refusal(self, declared: str, quantization: str = "") -> str:
        """Why a device declaring ``declared`` (and the file's ``quantization``,
        its agent's word, "" if unsaid) is not eligible for this model, in
        plain words for its machine page; "" when ``weights_match``."""
        if self.weights_match(declared):
            return ""
        if not declared:
            return "did not say which weights it runs; update the agent"
        other = quantization or f"sha256 {declared[:12]}…"
        ours = self.quantization or f"sha256 {self.weights_sha256[:12]}…"
        if other == ours:  # same quantization, other file (a fine-tune, a re-quant)
            other = f"{other} sha256 {declared[:12]}…"
            ours = f"{ours} sha256 {self.weights_sha256[:12]}…"
        return f"runs other weights than {self.id}: {other}, the catalog's is {ours}"


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
