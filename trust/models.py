"""What trust keeps of its own: each catalog entry's verification calibration
and the honest answers it is derived from (DESIGN.md "Verifying real
answers": what honest answers score is calibrated per model and
quantization; ``trust.verification.calibration``). The pool, spot checks and
verifications keep their tables in ``jobs`` (they moved without their data).
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from trust.verification.plausibility import Thresholds


class ModelCalibration(models.Model):
    """Verification's thresholds for one catalog entry, for the weights it
    pinned when they were set (``weights_sha256``, ``quantization``: a
    re-pinned entry is not calibrated until its new weights are,
    ``calibration.calibration_of``). The fields are
    ``plausibility.Thresholds``' (tokens, shares of an answer's tokens, z;
    ``z_low``/``z_high`` None: z judges no temperature). ``samples``: the
    honest answers they come from; ``source``: ``reference`` (the reference
    model's calibration, ``bench/verification.py``) or ``fleet`` (trusted
    devices' answers scored by trusted verifiers)."""

    class Source(models.TextChoices):
        REFERENCE = "reference"
        FLEET = "fleet"

    model = models.OneToOneField(
        "catalog.CatalogModel",
        primary_key=True,
        on_delete=models.CASCADE,
        related_name="calibration",
    )
    weights_sha256 = models.CharField(max_length=64, blank=True)
    quantization = models.CharField(max_length=32, blank=True)
    greedy_misses_base = models.FloatField()
    greedy_misses_share = models.FloatField()
    outside_base = models.FloatField()
    outside_share = models.FloatField()
    z_min = models.FloatField()
    z_low = models.FloatField(null=True, blank=True)
    z_high = models.FloatField(null=True, blank=True)
    samples = models.PositiveIntegerField(default=0)
    source = models.CharField(max_length=12, choices=Source.choices)
    calibrated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"calibration of {self.model_id}"

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(
            greedy_misses_base=self.greedy_misses_base,
            greedy_misses_share=self.greedy_misses_share,
            outside_base=self.outside_base,
            outside_share=self.outside_share,
            z_min=self.z_min,
            z_low=self.z_low,
            z_high=self.z_high,
        )


class CalibrationSample(models.Model):
    """One honest answer's statistics for a model's calibration: a trusted
    device's answer (``trusted.devices_trusted``) scored by a trusted
    verifier of another owner (``verification``), under the weights the
    entry pinned then. ``temperature`` the job's (0: greedy), ``n`` tokens
    scored, ``z``, ``misses``, ``outside`` (``plausibility.answer_stats``)."""

    model = models.ForeignKey(
        "catalog.CatalogModel", on_delete=models.CASCADE, related_name="samples"
    )
    weights_sha256 = models.CharField(max_length=64, blank=True)
    quantization = models.CharField(max_length=32, blank=True)
    verification = models.OneToOneField(
        "jobs.Verification",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="calibration_sample",
    )
    temperature = models.FloatField()
    n = models.PositiveIntegerField()
    z = models.FloatField()
    misses = models.PositiveIntegerField()
    outside = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(
                fields=["model", "weights_sha256", "quantization"],
                name="calibration_sample_weights",
            )
        ]
