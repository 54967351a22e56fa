"""Devices (GPUs, or a CPU) of a machine, the models on them, failed loads,
benchmarks and the coordinator's own measurements, DESIGN.md "Vocabulary" and
"Picking a device" (``Device.is_eligible_for``).
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models

from catalog.gpus import Verdict, measured_like, placement_verdict
from catalog.models import CatalogModel

from ..scoring import RELEASE_PASSES_IN_A_ROW, RELEASE_PASSES_NEW_DEVICE
from .machines import Machine


class Device(models.Model):
    """One GPU of a machine: slots, score and quarantine are per device.

    ``slots_used`` is the coordinator's own count of claims (never the host's
    word); ``slots_total`` comes from the latest heartbeat. ``kind`` is what its
    ``hello`` declared (``gpu``, or ``cpu``: then ``vram_total_mb`` and
    ``vram_free_mb`` are its system memory). Sizes are MiB,
    temperatures °C. ``quarantined``: held out of renter work, spot checks
    only, until ``quarantine_passes_needed`` checks in a row pass; why, in
    ``quarantine_reason`` (a device new to a machine starts there too:
    ``hosts.services.trust``).
    """

    class Kind(models.TextChoices):
        """What its agent declared the device is (``hello``'s ``kind``)."""

        GPU = "gpu", "GPU"
        CPU = "cpu", "CPU"

    class QuarantineReason(models.TextChoices):
        """Why a device is quarantined, which says how it leaves."""

        FAILURES = "failures", "failed checks or a score under 50"
        STAFF = "staff", "quarantined by staff"
        INHERITED = "inherited", "a device of its machine is quarantined"
        NEW_DEVICE = "new_device", "new to a machine that had devices: checked first"

    machine = models.ForeignKey(
        Machine, on_delete=models.CASCADE, related_name="devices"
    )
    index = models.PositiveIntegerField()
    name = models.CharField(max_length=200)
    kind = models.CharField(
        max_length=8, choices=Kind.choices, default=Kind.GPU, db_default=Kind.GPU
    )
    vram_total_mb = models.PositiveIntegerField(default=0)
    vram_free_mb = models.PositiveIntegerField(null=True, blank=True)
    temp_c = models.FloatField(null=True, blank=True)
    slots_total = models.PositiveIntegerField(default=0)
    slots_used = models.PositiveIntegerField(default=0)
    score = models.PositiveSmallIntegerField(default=60, db_index=True)
    quarantined = models.BooleanField(default=False)
    quarantined_at = models.DateTimeField(null=True, blank=True)
    quarantine_reason = models.CharField(
        max_length=16,
        blank=True,
        default="",
        db_default="",
        choices=QuarantineReason.choices,
        help_text="why it is quarantined ('' when it is not)",
    )
    paused = models.BooleanField(default=False, help_text="paused by staff")
    first_seen_at = models.DateTimeField(auto_now_add=True)
    spot_check_due_at = models.DateTimeField(
        null=True,
        blank=True,
        db_index=True,
        help_text="a spot check is to be sent after this",
    )
    spot_check_reason = models.CharField(max_length=16, blank=True, db_default="")
    verifier_check_due_at = models.DateTimeField(
        null=True,
        blank=True,
        db_index=True,
        help_text="a check of this device as a verifier is to be sent after this",
    )
    verifier_passes = models.PositiveIntegerField(
        default=0,
        help_text="checks as a verifier passed since its last failed one"
        " (trusted from BALLAST_VERIFIER_TRUST_PASSES)",
    )
    retired_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="missing from the machine's latest hello: kept, never eligible",
    )
    reference = models.BooleanField(
        default=False,
        db_default=False,
        help_text="a reference device, marked by staff: trusted to establish the"
        " answers of spot checks for models the coordinator cannot run",
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
    def quarantine_passes_needed(self) -> int:
        """Spot checks in a row it must pass to leave quarantine: 1 for a device
        new to its machine (checked before work), else 3 (DESIGN.md "Spot
        checks"; ``hosts.scoring.RELEASE_PASSES_IN_A_ROW``)."""
        if self.quarantine_reason == self.QuarantineReason.NEW_DEVICE:
            return RELEASE_PASSES_NEW_DEVICE
        return RELEASE_PASSES_IN_A_ROW

    @property
    def label(self) -> str:
        """A public label for renters' job logs, like ``rig-1/gpu0`` (``cpu0``
        for a CPU; no secret)."""
        return f"{self.machine.name}/{self.short_label}"

    @property
    def short_label(self) -> str:
        """``gpu0``, or ``cpu0`` for a device its agent declared a CPU."""
        return f"{self.kind}{self.index}"

    def is_eligible_for(
        self,
        job,
        *,
        vram_per_request_mb: int,
        now: datetime,
        loaded: bool,
        rented: bool,
        tried: bool,
        placed: tuple[str, int] = ("", 0),
        pinned: CatalogModel | None = None,
        weights: str = "",
        verifying: bool = False,
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
        the device already had an attempt of ``job``; ``placed``: its
        device-model row's (``placed_name``, ``placed_vram_mb``) for the job's
        model (what its measurements allow ``placement.gpu`` and
        ``min_vram_gb``: ``placement_meets``). Reads ``self.machine`` and its
        lease. A spot check reaches a quarantined or rented device; a rental's
        job only its rented device. ``pinned``: the job's catalog entry, whose
        weights the device must run (``CatalogModel.weights_match``) by
        ``weights``, the digest its device-model row declares. ``verifying``:
        a verification sent to the device on its machine's current connection
        is still open (its engine is scoring: no free slot, as one a job takes;
        rule 3).
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
            and (pinned is None or pinned.weights_match(weights))  # the catalog's
            and self.slots_used < self.slots_total
            and not verifying
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
            and self.placement_meets(placement, placed=placed)
            and (
                not placement.get("region")
                or str(placement["region"]).upper() == machine.region.upper()
            )
            and machine.serves(job.features_needed)  # rule 6: what the output needs
        )

    def placement_meets(self, placement: dict, *, placed: tuple[str, int]) -> bool:
        """Whether this device meets ``placement``'s ``gpu`` and ``min_vram_gb``
        (rule 6) by what Ballast measured, not by what its host declared
        (docs/design-notes.md "Placement by what was measured").

        ``placed``: its device-model row's (``placed_name``, ``placed_vram_mb``)
        for the job's model, which ``hosts.services.device_speed_record`` sets
        from the device's measured speed (``catalog.gpus.placement_verdict``).
        With ``gpu`` or ``min_vram_gb`` asked, the device must be declared a
        GPU (``kind``) and ``placed_name`` must be its current name (a device
        not measured yet, or measured slower than its declared class, has '':
        it takes only unplaced work). Then ``gpu`` must be in its name (case
        ignored) and ``min_vram_gb`` (GB of 1024 MiB, ``vram_need_mb``) must be
        covered by its declared VRAM and by the VRAM its class is credited
        (``placed_vram_mb``). ``jobs.selectors`` holds the same rule as SQL
        (``placement_sql``) and as a Q (``placement_filter``); tests hold the
        three equal.
        """
        gpu = placement.get("gpu")
        min_vram_gb = placement.get("min_vram_gb")
        if not gpu and min_vram_gb is None:
            return True
        placed_name, placed_vram_mb = placed
        need_mb = vram_need_mb(min_vram_gb) if min_vram_gb is not None else 0
        return (
            self.kind == self.Kind.GPU
            and placed_name != ""
            and placed_name == self.name
            and placed_vram_mb >= need_mb
            and (not gpu or str(gpu).upper() in self.name.upper())
            and self.vram_total_mb >= need_mb
        )


def vram_need_mb(min_vram_gb) -> int:
    """The MiB a ``placement.min_vram_gb`` asks (GB of 1024 MiB, a number as
    admitted by ``jobs.requests``), truncated to an integer."""
    return int(float(min_vram_gb) * 1024)


class DeviceModel(models.Model):
    """A catalog model on a device: loaded or not, and its recent first-token time.

    ``ttft_ms_recent`` is the device's median time to first token for this model
    over the last hour (ms), or null when unknown (sorts after known ones).

    ``measured_tokens_per_s``, ``measured_jobs``, ``placed_name`` and
    ``placed_vram_mb`` are what the coordinator measured of the device on this
    model and what that allows placement (``hosts.services.
    device_speed_record``; ``Device.placement_meets``).

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
    measured_tokens_per_s = models.FloatField(
        null=True,
        blank=True,
        help_text="median tokens/s of its latest measured jobs of the model"
        " (offer to done, by the coordinator); null until enough were measured",
    )
    measured_jobs = models.PositiveIntegerField(default=0, db_default=0)
    placed_name = models.CharField(
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text="the device name its measured speed was found consistent"
        " with (placed by gpu/min_vram_gb while the device keeps it); '' if not",
    )
    placed_vram_mb = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="VRAM credited for min_vram_gb: declared, up to its class's",
    )
    score = models.PositiveSmallIntegerField(
        default=60, db_default=60, help_text="copy of the device's score (trigger)"
    )
    tiebreak = models.FloatField(
        default=0.0, db_default=0.0, help_text="random tie-break key (see above)"
    )
    weights_sha256 = models.CharField(
        max_length=64,
        blank=True,
        default="",
        db_default="",
        help_text="sha256 of the file its engine loaded, as its agent declared"
        " it ('' when it did not say: CatalogModel.weights_match)",
    )
    weights_quantization = models.CharField(
        max_length=32,
        blank=True,
        default="",
        db_default="",
        help_text="that file's quantization, as its agent declared it",
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

    def placement_verdict(self) -> Verdict:
        """What the device's measured speed on this model allows placement now,
        by what the device declares (``catalog.gpus.placement_verdict``; reads
        ``self.device``). ``placed_name`` holds its result as of the last
        measurement or ``hello`` (``hosts.services.device_placement_judge``)."""
        device = self.device
        return placement_verdict(
            name=device.name,
            kind=device.kind,
            vram_total_mb=device.vram_total_mb,
            model_id=self.model_id,
            tokens_per_s=self.measured_tokens_per_s,
        )

    @property
    def measured_like(self) -> str:
        """What its measured speed is like, in words (``catalog.gpus.
        measured_like``); '' while not measured."""
        if self.measured_tokens_per_s is None:
            return ""
        return measured_like(
            model_id=self.model_id, tokens_per_s=self.measured_tokens_per_s
        )


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
        verbose_name_plural = "failed capabilities"
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


class Measurement(models.Model):
    """The coordinator's own measure of one succeeded job on a device: its
    answer's ``tokens`` (the coordinator's count) over ``seconds`` from the
    offer to the host's ``done`` (network and prompt included: a host cannot
    shorten it). The latest ``catalog.gpus.MEASURED_KEPT`` per device and model
    are kept (``hosts.services.device_speed_record``)."""

    device = models.ForeignKey(
        Device, on_delete=models.CASCADE, related_name="measurements"
    )
    model_id = models.CharField(max_length=100)
    tokens = models.PositiveIntegerField()
    seconds = models.FloatField()
    measured_at = models.DateTimeField()

    class Meta:
        ordering = ["-measured_at", "-id"]
        indexes = [
            models.Index(
                fields=["device", "model_id", "-id"], name="measurement_device_model"
            )
        ]

    @property
    def tokens_per_s(self) -> float:
        """``tokens`` / ``seconds``."""
        return self.tokens / self.seconds
