"""What a device and a machine did over time: outcomes for the score, score
samples for the chart, online spans for the uptime (DESIGN.md "Reliability score"),
staff's quarantine decisions.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from .devices import Device
from .machines import Machine


class DeviceOutcome(models.Model):
    """One outcome that counts toward a device's score (DESIGN.md "Reliability score").

    Attempts and spot checks; a renter's cancel is never recorded. ``ttft_ms`` is
    the time to first token of a successful attempt, when known. ``job_ref``: the
    id of the job it was about ('' when none), ``detail``: why, in words (a failed
    check's finding), so staff answer "why was my device quarantined?" from the
    row, not the log. Audit records: never edited or deleted by staff.
    """

    class Source(models.TextChoices):
        ATTEMPT = "attempt"
        SPOT_CHECK = "spot_check"

    device = models.ForeignKey(
        Device, on_delete=models.CASCADE, related_name="outcomes"
    )
    source = models.CharField(max_length=12, choices=Source.choices)
    success = models.BooleanField()
    reason = models.CharField(max_length=32, blank=True)
    model_id = models.CharField(max_length=100, blank=True)
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    job_ref = models.CharField(
        max_length=36, blank=True, default="", db_default="", help_text="job id"
    )
    detail = models.CharField(max_length=300, blank=True, default="", db_default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["device", "-created_at"])]

    def __str__(self) -> str:
        verdict = "success" if self.success else "failure"
        return f"{self.device} {verdict} ({self.reason or self.source})"


class QuarantineDecision(models.Model):
    """Staff quarantined or released a device, with the reason its host reads on
    the machine page and in an email (``hosts.services.device_quarantine_by_staff``,
    ``device_release_by_staff``). A record: never edited or deleted."""

    class Action(models.TextChoices):
        QUARANTINE = "quarantine", "quarantined"
        RELEASE = "release", "released from quarantine"

    device = models.ForeignKey(
        Device, on_delete=models.CASCADE, related_name="quarantine_decisions"
    )
    action = models.CharField(max_length=12, choices=Action.choices)
    reason = models.CharField(max_length=500)
    staff = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.device} {self.get_action_display()}: {self.reason[:60]}"


class ScoreSample(models.Model):
    """A device's score at one moment, for the machine page's chart (web only).

    Taken by the beat task ``hosts.tasks.score_samples_take`` (every 15 min);
    samples older than 30 days are pruned by the same task.
    """

    device = models.ForeignKey(
        Device, on_delete=models.CASCADE, related_name="score_samples"
    )
    score = models.PositiveSmallIntegerField()
    taken_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["taken_at"]
        indexes = [models.Index(fields=["device", "taken_at"])]


class OnlineSpan(models.Model):
    """A stretch of time a machine was online, opened and closed on transitions.

    Opened when the machine becomes live (first heartbeat of a connection, or the
    first after a stale mark) — or the previous span extended, when it ended within
    ``BALLAST_HEARTBEAT_MAX_AGE_S`` (DESIGN.md "Reliability score": gaps ≤ 30 s) —
    and ended at the last heartbeat on a stale mark or a disconnect, or at its
    process lease's end when that lapsed. While the machine is live its latest span
    counts until now (``hosts.services.device_online_fraction``).
    """

    machine = models.ForeignKey(
        Machine, on_delete=models.CASCADE, related_name="online_spans"
    )
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-ended_at"]
        indexes = [models.Index(fields=["machine", "-ended_at"])]
