"""Jobs (one renter request, or one spot check) and their attempts (DESIGN.md
"Vocabulary", "Failover and continuation")."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from django.conf import settings
from django.db import models
from django.utils import timezone
from ..formats import features_needed
from .keys import ApiKey


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

    # set by ``services.job_finish`` on the job it returns: what the checks of
    # hosts' honesty ask to start once its end has committed
    # (``hooks.TrustHook.job_ended``), run by its coroutine on a success (not
    # stored)
    ended_then: Callable[[], None] | None = None
    # set by ``services.job_succeed``: the channels of the queued jobs its freed
    # slot wakes (``services.jobs_waiting_channels``, read in its transaction;
    # not stored)
    channels_to_wake: tuple[str, ...] = ()

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
        # a done with no output: not scored, since a renter's prompt or stop
        # sequence can make an honest model answer nothing; the answer is empty
        # once the request explains it or a second device agrees
        # (``failover.after_empty_answer``); spot checks judge hosts
        EMPTY_ANSWER = "empty_answer"

    class Exemption(models.TextChoices):
        NONE = "", "verified whole"
        STOP_CUT = "stop_cut", "its last token, cut by a stop sequence"
        CUT_CHARACTER = "cut_character", "bytes that are no character (U+FFFD)"

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
    # what of the answer a verifier scores, by what the coordinator checked of
    # the host's token ids (``trust.verification.exemptions``): ``verify_text``
    # None is ``output_text`` whole; ``exemption`` what was left out;
    # ``verify_token_ids`` the host's ids of it, scored instead of the text
    # tokenized again (None: not known to spell it)
    exemption = models.CharField(
        max_length=16, choices=Exemption.choices, blank=True, default=""
    )
    verify_text = models.TextField(null=True, blank=True)
    verify_token_ids = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["offered_at"]
        indexes = [
            models.Index(fields=["device", "state"]),
            # a device's latest answers (``verification.rate.exempt_multiplier``)
            models.Index(fields=["device", "ended_at"], name="attempt_device_ended"),
        ]

    # set by ``services.attempt_end`` with ``device_records_later``: the
    # device's records of this end, for its caller to write later in the same
    # transaction (not stored)
    device_records: Callable[[], None] | None = None

    def __str__(self) -> str:
        return f"attempt {self.id} ({self.state} {self.outcome})"

    @property
    def ttft_ms(self) -> int | None:
        """Time from the offer to the first token, in ms; None before the first token."""
        if self.first_token_at is None:
            return None
        return round((self.first_token_at - self.offered_at).total_seconds() * 1000)
