"""Machines (one agent each) and their devices (GPUs), DESIGN.md "Vocabulary".

Rules about one row live here (``Machine.is_online``); anything that writes
several rows is in ``hosts.services``.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models


def token_hash(token: str) -> str:
    """Return the sha256 hex digest under which a secret token is stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_new(prefix: str) -> str:
    """Return a new random secret token like ``bm_…`` (43 url-safe chars of entropy)."""
    return f"{prefix}_{secrets.token_urlsafe(32)}"


class CoordinatorLease(models.Model):
    """One coordinator process's liveness lease (DESIGN.md "Picking a device", rule 1).

    Renewed by one loop of the process every ``BALLAST_LEASE_RENEW_S`` to
    ``lease_until`` = (the time its check began) + ``BALLAST_LEASE_S``. It says: as of
    ``lease_until``, every machine connected to this process, pointing at this lease
    and not marked ``stale``, had a heartbeat under ``BALLAST_HEARTBEAT_MAX_AGE_S``
    old. The loop marks stale, *before* renewing, every machine whose last heartbeat
    is older than ``hosts.liveness.stale_after_s()``. If the process stalls or dies
    the lease lapses and its machines are ineligible at once. ``name`` is for staff
    (host and pid).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    lease_until = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name or self.id} until {self.lease_until:%H:%M:%S}"


class Machine(models.Model):
    """One computer running one agent; authenticates with a machine token.

    The token is stored hashed (sha256); the plain token is shown once, when the
    machine is created. ``public_key`` is pinned by the first ``hello``
    (PROTOCOL.md §2) and only the owner can reset it.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="machines"
    )
    name = models.CharField(max_length=100)
    region = models.CharField(max_length=32, blank=True, db_index=True)
    token_hash = models.CharField(max_length=64, unique=True)
    token_prefix = models.CharField(max_length=12)
    public_key = models.CharField(max_length=64, blank=True)
    agent_version = models.CharField(max_length=32, blank=True)
    engine_name = models.CharField(max_length=64, blank=True)
    engine_version = models.CharField(max_length=64, blank=True)
    accepts_serverless = models.BooleanField(
        default=True, help_text="the owner's choice (dashboard)"
    )
    agent_accepts_serverless = models.BooleanField(
        default=True,
        db_default=True,
        help_text="the agent's hello: both must accept serverless jobs",
    )
    features = models.CharField(
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text="what its engine declared it does beyond text (hello.features):"
        " known names, space-separated, sorted",
    )
    paused = models.BooleanField(default=False, help_text="paused by its owner")
    host_paused = models.BooleanField(default=False, help_text="paused by the agent")
    connected = models.BooleanField(default=False)
    channel_name = models.CharField(max_length=200, blank=True)
    connected_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="a heartbeat at least this recent was received (written on changes)",
    )
    lease = models.ForeignKey(
        CoordinatorLease,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="machines",
        help_text="the coordinator process whose lease vouches for this connection",
    )
    stale = models.BooleanField(
        default=True,
        db_default=True,
        help_text="no heartbeat recent enough for the lease to vouch for (or none yet)",
    )
    offline_alert_sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def build(self) -> str:
        """The build this machine runs: ``agent version + engine name/version``."""
        return f"agent {self.agent_version} / {self.engine_name} {self.engine_version}"

    def serves(self, features) -> bool:
        """Whether this machine's engine declared every one of ``features``
        (names of ``hosts.protocol.FEATURES``) in its latest ``hello``."""
        declared = self.features.split()
        return all(feature in declared for feature in features)

    def is_online(self, now: datetime) -> bool:
        """True when the websocket is open and the last heartbeat is fresh.

        DESIGN.md "Picking a device", rule 1: heartbeat under
        ``BALLAST_HEARTBEAT_MAX_AGE_S`` (30 s) old and the connection open. Fresh
        means either proof: the recorded ``last_heartbeat_at`` is under the max age,
        or the machine is not ``stale`` and its process's lease runs past ``now``
        (see ``CoordinatorLease``). The same rule as ``hosts.liveness.live_q`` and
        the SQL of ``jobs.selectors``. Reads ``self.lease`` (select_related it).
        """
        if not self.connected:
            return False
        max_age = timedelta(seconds=settings.BALLAST_HEARTBEAT_MAX_AGE_S)
        if (
            self.last_heartbeat_at is not None
            and now - self.last_heartbeat_at < max_age
        ):
            return True
        return (
            not self.stale
            and self.lease_id is not None
            and self.lease.lease_until > now
        )

    def seen_until(self) -> datetime | None:
        """The latest time this machine is known to have counted as online, or None.

        The lease's end for a connected, non-stale machine it vouches for (a lapsed
        lease: when its process stopped vouching), else the recorded last heartbeat.
        Used for "gone more than 10 min" and the offline alerts. Reads ``self.lease``.
        """
        seen = self.last_heartbeat_at
        if self.connected and not self.stale and self.lease_id is not None:
            until = self.lease.lease_until
            seen = until if seen is None else max(seen, until)
        return seen


class Device(models.Model):
    """One GPU of a machine: slots, score and quarantine are per device.

    ``slots_used`` is the coordinator's own count of claims (never the host's
    word); ``slots_total`` comes from the latest heartbeat. Sizes are MiB,
    temperatures °C.
    """

    machine = models.ForeignKey(
        Machine, on_delete=models.CASCADE, related_name="devices"
    )
    index = models.PositiveIntegerField()
    name = models.CharField(max_length=200)
    vram_total_mb = models.PositiveIntegerField(default=0)
    vram_free_mb = models.PositiveIntegerField(null=True, blank=True)
    temp_c = models.FloatField(null=True, blank=True)
    slots_total = models.PositiveIntegerField(default=0)
    slots_used = models.PositiveIntegerField(default=0)
    score = models.PositiveSmallIntegerField(default=60, db_index=True)
    quarantined = models.BooleanField(default=False)
    quarantined_at = models.DateTimeField(null=True, blank=True)
    paused = models.BooleanField(default=False, help_text="paused by staff")
    first_seen_at = models.DateTimeField(auto_now_add=True)
    spot_check_due_at = models.DateTimeField(
        null=True,
        blank=True,
        db_index=True,
        help_text="a spot check is to be sent after this",
    )
    spot_check_reason = models.CharField(max_length=16, blank=True, db_default="")
    retired_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="missing from the machine's latest hello: kept, never eligible",
    )

    class Meta:
        ordering = ["machine__name", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["machine", "index"], name="device_unique_index"
            ),
            models.CheckConstraint(
                condition=models.Q(slots_used__gte=0), name="device_slots_used_nonneg"
            ),
        ]

    def __str__(self) -> str:
        return self.label

    @property
    def label(self) -> str:
        """A public label for renters' job logs, like ``rig-1/gpu0`` (no secret)."""
        return f"{self.machine.name}/gpu{self.index}"

    def is_eligible_for(
        self,
        job,
        *,
        vram_per_request_mb: int,
        now: datetime,
        loaded: bool,
        rented: bool,
        tried: bool,
    ) -> bool:
        """Whether this device may take ``job`` now: DESIGN.md "Picking a device",
        rules 1–6, for one row (``jobs.selectors.devices_eligible`` is the same
        rule as one query; a test holds the two equal).

        ``job``: its ``placement``, ``target_device_id``, ``is_spot_check``,
        ``rental_id`` and ``features_needed`` (what its output needs of the
        engine: ``response_format``, ``logprobs``) are read;
        ``vram_per_request_mb``: the model's need (MiB);
        ``loaded``: the device's latest report lists the job's model as loaded;
        ``rented``: the device has an open (pending or live) rental; ``tried``:
        the device already had an attempt of ``job``. Reads ``self.machine``
        and its lease. A spot check reaches a quarantined or rented device; a
        rental's job only its rented device.
        """
        machine = self.machine
        placement = job.placement or {}
        serverless = not job.is_spot_check and not job.rental_id
        return (
            machine.is_online(now)  # rule 1
            and self.retired_at is None  # and in its latest hello
            and not (self.paused or machine.paused or machine.host_paused)  # rule 2
            and (job.is_spot_check or not self.quarantined)
            and loaded  # rule 3
            and self.slots_used < self.slots_total
            and (self.temp_c is None or self.temp_c < settings.BALLAST_MAX_GPU_TEMP_C)
            and self.vram_free_mb is not None  # rule 4
            and self.vram_free_mb >= vram_per_request_mb
            and not (  # rule 5
                serverless
                and (
                    not machine.accepts_serverless
                    or not machine.agent_accepts_serverless
                    or rented
                )
            )
            and not tried  # rule 6
            and (not job.target_device_id or job.target_device_id == self.id)
            and (
                not placement.get("gpu")
                or str(placement["gpu"]).upper() in self.name.upper()
            )
            and (
                placement.get("min_vram_gb") is None
                or self.vram_total_mb >= int(float(placement["min_vram_gb"]) * 1024)
            )
            and (
                not placement.get("region")
                or str(placement["region"]).upper() == machine.region.upper()
            )
            and machine.serves(job.features_needed)  # rule 6: what the output needs
        )


class DeviceModel(models.Model):
    """A catalog model on a device: loaded or not, and its recent first-token time.

    ``ttft_ms_recent`` is the device's median time to first token for this model
    over the last hour (ms), or null when unknown (sorts after known ones).

    ``score`` and ``tiebreak`` are the rest of the ranking key of DESIGN.md
    "Picking a device", kept here so that one index (``devicemodel_ranking``:
    model, score desc, first-token time nulls last, tie-break; loaded rows only)
    serves the pick whatever the fleet size. Database triggers keep them
    (migration ``hosts.0006_devicemodel_ranking``):

    * ``score`` is a copy of the device's score, written wherever the device's
      score is written (any UPDATE of ``hosts_device.score``, and at insert);
    * ``tiebreak`` is the random tie-break: the claim adds an Exp(1) draw to it
      (``jobs.selectors.TIEBREAK_STEP``), so among tied devices each claim takes
      each one with the same chance (the next event of independent Poisson
      clocks); a row entering a tie group (insert, score or first-token time
      change, loaded again) restarts at the group's lowest key plus a fresh draw.
    """

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="models")
    model_id = models.CharField(max_length=100)
    loaded = models.BooleanField(default=False)
    ttft_ms_recent = models.PositiveIntegerField(null=True, blank=True)
    first_loaded_at = models.DateTimeField(null=True, blank=True)
    score = models.PositiveSmallIntegerField(
        default=60, db_default=60, help_text="copy of the device's score (trigger)"
    )
    tiebreak = models.FloatField(
        default=0.0, db_default=0.0, help_text="random tie-break key (see above)"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["device", "model_id"], name="device_model_unique"
            )
        ]
        indexes = [models.Index(fields=["model_id", "loaded"])]

    def __str__(self) -> str:
        return f"{self.device} {self.model_id}"


class FailedCapability(models.Model):
    """A model that did not load on a build, with the engine's error (the latest
    builds' kept per device and model, ``hosts.services.capability_failed_record``)."""

    machine = models.ForeignKey(
        Machine, on_delete=models.CASCADE, related_name="failed_capabilities"
    )
    device_index = models.PositiveIntegerField()
    model_id = models.CharField(max_length=100)
    build = models.CharField(max_length=200)
    error = models.TextField()
    count = models.PositiveIntegerField(default=1)
    first_at = models.DateTimeField(auto_now_add=True)
    last_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["machine", "device_index", "model_id", "build"],
                name="failed_capability_unique",
            )
        ]


class Benchmark(models.Model):
    """A benchmark measured on the host's own hardware (real figures, not estimates)."""

    device = models.ForeignKey(
        Device, on_delete=models.CASCADE, related_name="benchmarks"
    )
    model_id = models.CharField(max_length=100)
    tokens_per_s = models.FloatField()
    ttft_ms = models.FloatField()
    vram_used_mb = models.PositiveIntegerField(null=True, blank=True)
    measured_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-measured_at"]


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
