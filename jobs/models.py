"""Renters' API keys, jobs and their attempts (the catalog is ``catalog.models``).

Money is integer nano-USD (``billing.money``); times are timezone-aware UTC.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from datetime import timezone as dt_timezone

from django.conf import settings
from django.db import models
from django.utils import timezone

from .formats import features_needed


class ApiKey(models.Model):
    """A renter's API key, stored as a sha256 hash; the plain key is shown once.

    A key may have a spending cap (docs/money.md "Spending caps"): at most
    ``spend_cap_nano`` charged in each ``spend_cap_period`` (a UTC day, a UTC
    calendar month, or ever). ``spent_nano`` is what its jobs were charged
    since ``spent_since`` (the start of the period it counts), kept by
    ``jobs.services.caps`` while a cap is set.
    """

    class Period(models.TextChoices):
        DAY = "day", "per day (UTC)"
        MONTH = "month", "per calendar month (UTC)"
        TOTAL = "total", "in total"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100, default="default")
    prefix = models.CharField(max_length=16)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    spend_cap_nano = models.BigIntegerField(null=True, blank=True)
    spend_cap_period = models.CharField(
        max_length=8, choices=Period.choices, default=Period.MONTH
    )
    spent_nano = models.BigIntegerField(default=0)
    spent_since = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"

    def spend_period_start(self, now: datetime) -> datetime:
        """The start of the cap's period that holds ``now`` (aware UTC): midnight
        UTC of that day, the first of that month, or the epoch for ``total``."""
        now = now.astimezone(dt_timezone.utc)
        if self.spend_cap_period == self.Period.DAY:
            return now.replace(hour=0, minute=0, second=0, microsecond=0)
        if self.spend_cap_period == self.Period.MONTH:
            return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        return SPEND_EPOCH

    def spent_in_period_nano(self, now: datetime) -> int:
        """What the key was charged in the period holding ``now``, nano-USD (0
        when its counter belongs to an earlier period)."""
        if self.spent_since is None or self.spent_since != self.spend_period_start(now):
            return 0
        return self.spent_nano


SPEND_EPOCH = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)  # a total cap's period


class Job(models.Model):
    """One renter request (or one spot check); it has one or more attempts.

    ``output_text`` is exactly what the renter received; ``tokens_billed`` and
    ``cost_nano`` are what it was charged (nano-USD).
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"
        TIMED_OUT = "timed_out"

    class Endpoint(models.TextChoices):
        CHAT = "chat"
        COMPLETION = "completion"

    OPEN_STATUSES = (Status.QUEUED, Status.RUNNING)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    renter = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="jobs",
    )
    api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.SET_NULL
    )
    # no index of its own: the (model_id, status, created_at) index leads with it
    model_id = models.CharField(max_length=100)
    endpoint = models.CharField(max_length=16, choices=Endpoint.choices)
    messages = models.JSONField(null=True, blank=True)
    prompt = models.TextField(null=True, blank=True)
    params = models.JSONField(default=dict)
    placement = models.JSONField(default=dict, blank=True)
    stream = models.BooleanField(default=False)
    is_spot_check = models.BooleanField(default=False)
    # no index of its own (nor its LIKE twin): the open jobs are found through
    # the partial indexes below, and every status change updates each index
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.QUEUED
    )
    failed_over = models.BooleanField(default=False)
    output_text = models.TextField(blank=True, default="")
    finish_reason = models.CharField(max_length=16, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    tokens_billed = models.PositiveIntegerField(default=0)
    cost_nano = models.BigIntegerField(default=0)
    price_completion_nano = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="the model's completion price when the job was admitted, nano-USD "
        "per token: what it is charged at (none: the catalog's, for older jobs)",
    )
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)
    target_device = models.ForeignKey(
        "hosts.Device",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="spot checks and rentals run on this device only",
    )
    rental = models.ForeignKey(
        "Rental", null=True, blank=True, on_delete=models.PROTECT, related_name="jobs"
    )
    waiting_channel = models.CharField(
        max_length=200, blank=True, help_text="channel to wake while queued for a slot"
    )
    lease_until = models.DateTimeField(
        null=True, blank=True, help_text="renewed by the coroutine that owns the job"
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["model_id", "status", "created_at"]),
            # the renter's open jobs, which every credit check sums
            # (``jobs.services._credit_sql``): without it the check read every
            # job the renter ever had; the statuses are OPEN_STATUSES
            # (checked by tests/jobs/test_credit.py)
            models.Index(
                fields=["renter"],
                condition=models.Q(status__in=["queued", "running"]),
                name="job_open_by_renter",
            ),
        ]

    # set by ``services.job_finish`` on the job it returns: the verification
    # chosen at its end, for its coroutine to send once committed (not stored)
    verification_chosen: Verification | None = None

    def __str__(self) -> str:
        return f"job {self.id} ({self.status})"

    @property
    def features_needed(self) -> tuple[str, ...]:
        """What this job asks of its device's engine beyond text: a subset of
        ``hosts.protocol.FEATURES`` (``jobs.formats.features_needed``); a
        device whose machine did not declare them all is not eligible."""
        return features_needed(self.params or {})


class Attempt(models.Model):
    """One try of a job on one device: offered → claimed → streaming → ended.

    Deadlines come from DESIGN.md "When a host fails": ``claim_deadline`` is
    offer + 5 s, ``first_token_deadline`` is claim + 20 s. ``output_text`` is the
    exact text of this attempt's segment of the answer, as relayed to the renter;
    ``tokens_billed`` is 0 when the renter received none of it (a non-streamed
    answer whose renter left before its response).
    """

    class Kind(models.TextChoices):
        FRESH = "fresh"
        CONTINUATION = "continuation"

    class State(models.TextChoices):
        OFFERED = "offered"
        CLAIMED = "claimed"
        STREAMING = "streaming"
        ENDED = "ended"

    class Outcome(models.TextChoices):
        SUCCEEDED = "succeeded"
        CLAIM_TIMEOUT = "claim_timeout"
        FIRST_TOKEN_TIMEOUT = "first_token_timeout"
        HOST_ERROR = "host_error"
        DIED_MIDSTREAM = "died_midstream"
        STALLED = "stalled"
        CANCELLED = "cancelled"
        # a done with no output: the attempt fails (another device is tried) but
        # the device's score is not touched, since a renter's prompt or stop
        # sequence can make an honest model answer nothing; spot checks judge hosts
        EMPTY_ANSWER = "empty_answer"

    OPEN_STATES = (State.OFFERED, State.CLAIMED, State.STREAMING)
    FAILURES = (
        Outcome.CLAIM_TIMEOUT,
        Outcome.FIRST_TOKEN_TIMEOUT,
        Outcome.HOST_ERROR,
        Outcome.DIED_MIDSTREAM,
        Outcome.STALLED,
    )

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    device = models.ForeignKey(
        "hosts.Device", on_delete=models.PROTECT, related_name="attempts"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.FRESH)
    state = models.CharField(
        max_length=16, choices=State.choices, default=State.OFFERED, db_index=True
    )
    outcome = models.CharField(max_length=24, choices=Outcome.choices, blank=True)
    error_message = models.TextField(blank=True)
    continue_from_chars = models.PositiveIntegerField(default=0)
    offered_at = models.DateTimeField(default=timezone.now)
    claim_deadline = models.DateTimeField()
    claimed_at = models.DateTimeField(null=True, blank=True)
    first_token_deadline = models.DateTimeField(null=True, blank=True)
    first_token_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    output_text = models.TextField(blank=True, default="")
    output_chars = models.PositiveIntegerField(default=0)
    completion_tokens_reported = models.PositiveIntegerField(null=True, blank=True)
    prompt_tokens_reported = models.PositiveIntegerField(null=True, blank=True)
    tokens_billed = models.PositiveIntegerField(default=0)
    receipt = models.CharField(max_length=200, blank=True)
    receipt_valid = models.BooleanField(null=True)
    token_count_flagged = models.BooleanField(default=False)

    class Meta:
        ordering = ["offered_at"]
        indexes = [models.Index(fields=["device", "state"])]

    def __str__(self) -> str:
        return f"attempt {self.id} ({self.state} {self.outcome})"

    @property
    def ttft_ms(self) -> int | None:
        """Time from the offer to the first token, in ms; None before the first token."""
        if self.first_token_at is None:
            return None
        return round((self.first_token_at - self.offered_at).total_seconds() * 1000)


class CanaryPrompt(models.Model):
    """One prompt of a model's spot-check pool (DESIGN.md "Spot checks").

    Draw ``index`` of ``jobs.canarygen`` (from the deployment's secret), in the
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


class Rental(models.Model):
    """A device reserved for one renter for a period, checked before and during.

    Goes ``pending`` → ``live`` after a passed spot check; ``stopped`` by a failed
    check (billed only up to the last pass); ``ended`` at its end or by the renter.
    Priced per hour in nano-USD.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        LIVE = "live"
        STOPPED = "stopped"
        ENDED = "ended"

    OPEN_STATUSES = (Status.PENDING, Status.LIVE)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    renter = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="rentals"
    )
    device = models.ForeignKey(
        "hosts.Device", on_delete=models.PROTECT, related_name="rentals"
    )
    hours = models.PositiveIntegerField()
    price_per_hour_nano = models.BigIntegerField()
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    starts_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True)
    last_pass_at = models.DateTimeField(null=True, blank=True)
    last_check_at = models.DateTimeField(null=True, blank=True)
    billed_until = models.DateTimeField(null=True, blank=True)
    stop_reason = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"rental {self.id} ({self.status})"


class Verification(models.Model):
    """One re-scoring of a renter's answer by prefill on another owner's device
    (DESIGN.md "Verifying real answers"; ``jobs.verification``).

    ``job``, ``attempt`` and ``device``: the verified answer (a job of one
    fresh attempt) and the device that produced it; ``verifier``: the device
    asked (None: ``no_verifier``); ``round`` 1, or 2 (the confirmation of an
    implausible round 1, on a device of a third owner). ``status``:
    ``offered`` (its ``verify`` frame sent at ``sent_at``; None while not yet
    handed to the verifier's connection), ``scored`` (judged: ``n``, ``z``,
    ``misses``, ``outside``, ``plausible``, ``detail``), ``refused`` (an
    ``error``, a malformed ``scores`` or a bad receipt: against the verifier),
    ``expired`` (no ``scores`` within ``BALLAST_VERIFY_DEADLINE_S``: against
    the verifier when it was sent), ``no_verifier``. ``verdict``: what followed
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

    class Verdict(models.TextChoices):
        NONE = "", "none yet"
        PLAUSIBLE = "plausible"  # round 1 plausible: nothing follows
        CONFIRMING = "confirming"  # round 1 implausible: a round 2 asked
        UNCONFIRMED = "unconfirmed"  # implausible once, never confirmed: nothing follows
        CLEARED = "cleared"  # round 2 plausible: nothing follows
        FAILED = "failed"  # round 2 implausible too: a failed check of the device

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="verifications")
    attempt = models.ForeignKey(
        Attempt, on_delete=models.CASCADE, related_name="verifications"
    )
    device = models.ForeignKey(
        "hosts.Device", on_delete=models.CASCADE, related_name="verified"
    )
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
        ]

    def __str__(self) -> str:
        return f"verification {self.id} of job {self.job_id} round {self.round} ({self.status})"
