"""What a device and a machine did over time: outcomes for the score, score
samples for the chart, online spans for the uptime (DESIGN.md "Reliability score").
"""

from __future__ import annotations

from django.db import models

from .devices import Device
from .machines import Machine


class DeviceOutcome(models.Model):
    """One outcome that counts toward a device's score (DESIGN.md "Reliability score").

    Attempts and spot checks; a renter's cancel is never recorded. ``ttft_ms`` is
    the time to first token of a successful attempt, when known.
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
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["device", "-created_at"])]


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
