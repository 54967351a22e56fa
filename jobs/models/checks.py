"""Spot checks: the pool of prompts per model and each check sent (DESIGN.md
"Spot checks")."""

from __future__ import annotations


from django.db import models
from django.utils import timezone
from .jobs import Job


class CanaryPrompt(models.Model):
    """One prompt of a model's spot-check pool (DESIGN.md "Spot checks").

    Draw ``index`` of ``trust.canarygen`` (from the deployment's secret), in the
    shape of a real job: ``endpoint`` with ``messages`` or ``prompt``, ``params``
    (at temperature 0) and ``stream``; ``expected`` its right answer,
    ``distractors`` the other answers its prompt names. ``status``: ``drawn``,
    then ``calibrated`` only when the reference model gave the right answer
    (``reference_output``), so honest hosts pass, else ``rejected``;
    ``retired`` prompts are never sent (the hand-written ones this repository
    once shipped). ``sent_count``: how many devices were sent it (each at most
    once: ``SpotCheck``). Lives only in the database, never in a file.
    """

    class Status(models.TextChoices):
        DRAWN = "drawn"
        CALIBRATED = "calibrated"
        REJECTED = "rejected"
        RETIRED = "retired"

    model_id = models.CharField(max_length=100)
    index = models.PositiveIntegerField(null=True, blank=True)
    family = models.CharField(max_length=16, blank=True)
    endpoint = models.CharField(max_length=16, default="chat")
    messages = models.JSONField(null=True, blank=True)
    prompt = models.TextField(null=True, blank=True)
    params = models.JSONField(default=dict)
    stream = models.BooleanField(default=False)
    expected = models.CharField(max_length=200)
    distractors = models.JSONField(default=list, blank=True)
    status = models.CharField(
        max_length=12, choices=Status.choices, default=Status.DRAWN
    )
    reference_output = models.TextField(blank=True)
    # a check of verifiers (trust.verification.checks): the temperature it is
    # scored at, the reference model's answer sampled there (plausible) and a
    # decoy answer it finds implausible there
    check_temperature = models.FloatField(null=True, blank=True)
    check_output = models.TextField(blank=True)
    decoy_output = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    calibrated_at = models.DateTimeField(null=True, blank=True)
    sent_count = models.PositiveIntegerField(default=0)
    first_sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["model_id", "index"], name="canary_unique_draw"
            )
        ]
        indexes = [
            # the pick: a model's calibrated prompts, the least sent first
            models.Index(
                fields=["model_id", "status", "sent_count"], name="canary_pick"
            )
        ]

    def __str__(self) -> str:
        return f"{self.model_id} #{self.index} ({self.status})"


class SpotCheck(models.Model):
    """One spot check of a device: its canary, why it was sent, and the verdict.

    A device is sent a canary at most once (``spot_check_canary_once``).
    """

    class Reason(models.TextChoices):
        RATE = "rate"
        FIRST_LOAD = "first_load"
        RETURN = "return"
        QUARANTINE = "quarantine"
        RENTAL = "rental"
        STAFF = "staff"
        CALIBRATION = "calibration"  # a candidate's answer asked of a trusted device

    device = models.ForeignKey(
        "hosts.Device", on_delete=models.CASCADE, related_name="spot_checks"
    )
    canary = models.ForeignKey(
        CanaryPrompt, on_delete=models.PROTECT, related_name="checks"
    )
    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="spot_check")
    reason = models.CharField(max_length=16, choices=Reason.choices)
    passed = models.BooleanField(null=True)
    detail = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    judged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["device", "canary"], name="spot_check_canary_once"
            )
        ]
