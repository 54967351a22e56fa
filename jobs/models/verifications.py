"""Verifications of real answers by prefill (DESIGN.md "Verifying real answers")."""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone
from .checks import CanaryPrompt
from .jobs import Attempt, Job


class Verification(models.Model):
    """One re-scoring of a renter's answer by prefill on another owner's device
    (DESIGN.md "Verifying real answers"; ``trust.verification``).

    ``job``, ``attempt`` and ``device``: the verified answer (a job of one
    fresh attempt) and the device that produced it; ``verifier``: the device
    asked (None: ``no_verifier``), ``verifier_trusted`` whether it had passed
    its checks as a verifier when asked; ``round`` 1, or 2 (the confirmation
    of an implausible round 1, on a device of a third owner). A check of a
    verifier (``trust.verification.checks``) has no job: ``canary`` (the
    spot-check pool's prompt it scores an answer of) and ``expected_plausible``
    (its answer is the reference model's, or a decoy the reference model
    finds implausible); its verdict ``passed`` or ``failed``. ``status``:
    ``offered`` (its ``verify`` frame sent at ``sent_at``; None while not yet
    handed to the verifier's connection), ``scored`` (judged: ``n``, ``z``,
    ``misses``, ``outside``, ``plausible``, ``detail``), ``refused`` (an
    ``error``, a malformed ``scores`` or a bad receipt: against the verifier),
    ``expired`` (no ``scores`` within ``BALLAST_VERIFY_DEADLINE_S``: against
    the verifier when it was sent), ``no_verifier``, ``uncalibrated`` (drawn
    while its model's verification had no calibration: not verified,
    ``trust.verification.calibration``). ``verdict``: what followed
    for the verified device (``VERDICTS``). ``paid_nano``: the verifier's
    earning (nano-USD; from ``platform_checks``). The id (hex) is the
    ``verify`` frame's opaque ``job``. Staff see these in the admin; no host
    page lists them.
    """

    class Status(models.TextChoices):
        OFFERED = "offered"
        SCORED = "scored"
        REFUSED = "refused"
        EXPIRED = "expired"
        NO_VERIFIER = "no_verifier"
        # drawn, but its model's verification is not calibrated: not verified
        UNCALIBRATED = "uncalibrated"

    class Verdict(models.TextChoices):
        NONE = "", "none yet"
        PLAUSIBLE = "plausible"  # round 1 plausible: nothing follows
        CONFIRMING = "confirming"  # round 1 implausible: a round 2 asked
        UNCONFIRMED = "unconfirmed"  # implausible once, never confirmed: nothing follows
        CLEARED = "cleared"  # round 2 plausible: nothing follows
        FAILED = "failed"  # round 2 implausible too: a failed check of the device
        PASSED = "passed"  # a check of a verifier: judged as the reference model does
        # a trusted host's answer scored for its model's calibration: nothing follows
        SAMPLE = "sample"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.ForeignKey(
        Job, null=True, on_delete=models.CASCADE, related_name="verifications"
    )
    attempt = models.ForeignKey(
        Attempt, null=True, on_delete=models.CASCADE, related_name="verifications"
    )
    device = models.ForeignKey(
        "hosts.Device", null=True, on_delete=models.CASCADE, related_name="verified"
    )
    canary = models.ForeignKey(
        CanaryPrompt,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="verifier_checks",
    )
    expected_plausible = models.BooleanField(null=True)
    verifier_trusted = models.BooleanField(default=False)
    verifier = models.ForeignKey(
        "hosts.Device",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="verifications",
    )
    round = models.PositiveSmallIntegerField(default=1)
    status = models.CharField(max_length=12, choices=Status.choices)
    verdict = models.CharField(
        max_length=12, choices=Verdict.choices, blank=True, default=""
    )
    n = models.PositiveIntegerField(null=True, blank=True)
    z = models.FloatField(null=True, blank=True)
    misses = models.PositiveIntegerField(null=True, blank=True)
    outside = models.PositiveIntegerField(null=True, blank=True)
    plausible = models.BooleanField(null=True)
    detail = models.CharField(max_length=300, blank=True)
    paid_nano = models.BigIntegerField(default=0)
    offered_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)
    scored_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-offered_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "round"], name="verification_once_per_round"
            )
        ]
        indexes = [
            # the expiry (beat): offered ones past their deadline
            models.Index(
                fields=["offered_at"],
                condition=models.Q(status="offered"),
                name="verification_open",
            ),
            # the claim (jobs.selectors, rule 3): is the device scoring one?
            models.Index(
                fields=["verifier"],
                condition=models.Q(status="offered"),
                name="verification_open_verifier",
            ),
        ]

    def __str__(self) -> str:
        return f"verification {self.id} of job {self.job_id} round {self.round} ({self.status})"
