"""The end of a job: closed once, charged once, for what its renter received
(DESIGN.md "How a request flows" step 6, "Money"); and the reaper of jobs whose
coroutine died (step 8)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from ballast import metrics
from ballast.db import for_update
from ballast.writes import row_update
from ballast.rows import columns, instances
from billing.models import ReceiptCheck
from billing.services import ChargePlan, charge_plan, charge_post, segment_of
from catalog.models import CatalogModel
from hosts.models import Device, Machine

from ..hooks import hook
from ..models import Attempt, Job
from ..tokens import prompt_token_count, prompt_tokens_most
from .attempts import attempt_end
from .caps import key_spend_add
from .dispatch import WOKEN_PER_SLOT, jobs_waiting_channels
from .requests import key_empty_answer_record


@transaction.atomic(savepoint=False)
def job_succeed(
    *,
    job_id: str,
    attempt_id: str,
    segment_text: str,
    done: dict,
    answer_text: str,
    claimed_at: datetime | None = None,
    first_token_at: datetime | None = None,
    cancel_receipt: dict | None = None,
) -> Job:
    """End a job's last attempt as succeeded and close the job, in one transaction:
    the receipt and the count checked, the attempt closed, the slot freed, the
    outcome and score recorded, the renter charged, the hosts' holds and the
    platform credited.

    ``segment_text``: what that attempt delivered; ``answer_text``: the whole
    answer (a continuation's prefix included); ``done``: the host's done frame
    (see ``attempts.attempt_end``); ``cancel_receipt``: the host's receipt of a
    segment cut at ``max_tokens`` (its ``done`` then carries ``receipt`` None).
    Returns the finished job, with ``channels_to_wake``: the queued jobs its
    freed slot wakes (``dispatch.jobs_waiting_channels``, read here rather than
    in a call of its own after the end).
    """
    ended = attempt_end(
        attempt_id=attempt_id,
        outcome=Attempt.Outcome.SUCCEEDED,
        output_text=segment_text,
        done=done,
        claimed_at=claimed_at,
        first_token_at=first_token_at,
        cancel_receipt=cancel_receipt,
        device_records_later=True,
    )
    # the queued jobs its freed slot wakes (none freed: the attempt had ended),
    # read before the job's end: its charge locks the renter's account to the commit
    woken = (
        jobs_waiting_channels(model_id=ended.job.model_id, limit=WOKEN_PER_SLOT)
        if ended is not None
        else []
    )
    job = job_finish(
        job_id=job_id,
        status=Job.Status.SUCCEEDED,
        output_text=answer_text,
        finish_reason=done["finish_reason"],
        device_records=ended.device_records if ended is not None else None,
    )
    job.channels_to_wake = tuple(woken)
    return job


@transaction.atomic(savepoint=False)
def job_answered(*, job_id: str, output_text: str, finish_reason: str = "stop") -> Job:
    """Close a job whose last attempt's host ended it with no text, as answered
    by ``output_text``: what earlier attempts delivered (the model ended where
    the answer stood), or nothing (it ended at once, or ``max_tokens`` cut its
    first character: ``finish_reason`` ``length``; ``failover.
    after_empty_answer``). Succeeded, with ``finish_reason``, billed for what
    was delivered; an empty answer counts to its key's
    ``BALLAST_EMPTY_ANSWER_RATE`` (``requests.key_empty_answer_record``).
    Returns the finished job (unchanged when it had ended already)."""
    job = job_finish(
        job_id=job_id,
        status=Job.Status.SUCCEEDED,
        output_text=output_text,
        finish_reason=finish_reason,
    )
    if not output_text and job.api_key_id is not None:
        key_empty_answer_record(key_id=job.api_key_id)
    return job


@transaction.atomic(savepoint=False)
def job_finish(
    *,
    job_id: str,
    status: str,
    output_text: str,
    finish_reason: str = "",
    error_code: str = "",
    error_message: str = "",
    now: datetime | None = None,
    device_records: Callable[[], None] | None = None,
) -> Job:
    """Close a job once and charge what it delivered; a job already finished is
    returned unchanged (whatever the caller retries, one charge).

    ``device_records``: the ended attempt's records of its device
    (``attempts.attempt_end``'s ``device_records_later``), written just
    before the charge (at once when the job had ended already), so the
    device's row is locked only from there to the commit.

    Attempts still open end ``cancelled``. ``output_text``: what the renter
    is billed for, the text of its ended segments (what it received; a
    non-streamed answer whose renter left, what its hosts produced up to the
    cancel: DESIGN.md "Money", ``orchestration.run.JobRun._end_segment``).
    The checks of hosts' honesty are told (``hooks.TrustHook.job_ended``: a
    renter's answer may be chosen for verification); what they ask to start
    once this transaction has committed is the returned job's ``ended_then``,
    which its coroutine runs.
    """
    now = now or timezone.now()
    job = _job_locked(job_id)
    if job.status not in Job.OPEN_STATUSES:
        if device_records is not None:
            device_records()
        return job
    attempts = _attempts_of(job)
    still_open = [a for a in attempts if a.state in Attempt.OPEN_STATES]
    for attempt in still_open:
        attempt_end(
            attempt_id=str(attempt.id), outcome=Attempt.Outcome.CANCELLED, now=now
        )
    if still_open:  # read again as those ends wrote them
        attempts = _attempts_of(job)
    job.prompt_tokens = renter_prompt_tokens(
        [(a.kind, a.prompt_tokens_reported) for a in attempts],
        lambda: prompt_token_count(job.model_id, job.messages, job.prompt),
        most=prompt_tokens_most(job.model_id, job.messages, job.prompt),
        counted_without_report=bool(output_text),  # a failure after output
    )
    job.status = status
    job.output_text = output_text
    job.finish_reason = finish_reason
    job.error_code = error_code
    job.error_message = error_message[:2000]
    job.finished_at = now
    plan = job_charge_plan(job=job, attempts=attempts)
    row_update(job, _JOB_END_FIELDS)
    job.ended_then = hook().job_ended(job=job, attempts=attempts, now=now)
    if not job.is_spot_check:
        metrics.job_ended(
            model_id=job.model_id,
            status=status,
            failed_over=job.failed_over,
            created_at=job.created_at,
            finished_at=now,
            first_offered_at=attempts[0].offered_at if attempts else None,
            first_token_at=min(
                (a.first_token_at for a in attempts if a.first_token_at), default=None
            ),
        )
    # last, the device's row and then the renter's account: each is locked
    # from its write to the commit, and every end on the device, every request
    # and end of the renter, waits for it
    if device_records is not None:
        device_records()
    job_charge(job=job, plan=plan, now=now)
    return job


# what a job's end writes on its row (``job_finish``, ``job_charge_plan``)
_JOB_END_FIELDS = [
    "prompt_tokens",
    "status",
    "output_text",
    "finish_reason",
    "error_code",
    "error_message",
    "finished_at",
    "tokens_billed",
    "cost_nano",
]


_RENTER = Job._meta.get_field("renter").related_model
_JOB_READ = ((Job, "j"), (_RENTER, "r"))
_ATTEMPTS_READ = ((Attempt, "a"), (Device, "d"), (Machine, "m"), (ReceiptCheck, "c"))


def _job_locked(job_id: str) -> Job:
    """Job ``job_id`` with its renter (its charge names it), only the job's row
    locked; ``Job.DoesNotExist`` when there is none. One fixed statement
    (``ballast.rows``)."""
    pk = Job._meta.pk
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {columns(*_JOB_READ)} FROM {Job._meta.db_table} j"
            f" LEFT JOIN {_RENTER._meta.db_table} r ON r.id = j.renter_id"
            f" WHERE j.id = %s{for_update('j')}",
            [pk.get_db_prep_value(pk.to_python(job_id), connection)],
        )
        row = cursor.fetchone()
    if row is None:
        raise Job.DoesNotExist(f"no job {job_id}")
    job, job.renter = instances(row, *_JOB_READ)
    return job


def _attempts_of(job: Job) -> list[Attempt]:
    """The job's attempts in offer order, with device, machine and receipt
    check. One fixed statement (``ballast.rows``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {columns(*_ATTEMPTS_READ)} FROM {Attempt._meta.db_table} a"
            f" JOIN {Device._meta.db_table} d ON d.id = a.device_id"
            f" JOIN {Machine._meta.db_table} m ON m.id = d.machine_id"
            f" LEFT JOIN {ReceiptCheck._meta.db_table} c ON c.attempt_id = a.id"
            " WHERE a.job_id = %s ORDER BY a.offered_at, a.id",
            [Job._meta.pk.get_db_prep_value(job.id, connection)],
        )
        rows = cursor.fetchall()
    attempts = []
    for row in rows:
        attempt, device, machine, receipt = instances(row, *_ATTEMPTS_READ)
        device.machine = machine
        attempt.device = device
        attempt.job = job
        _RECEIPT_CHECK.set_cached_value(attempt, receipt)
        attempts.append(attempt)
    return attempts


# the attempt's receipt check, a reverse one-to-one (None cached: there is none)
_RECEIPT_CHECK = Attempt.receipt_check.related


def job_charge_plan(*, job: Job, attempts: list[Attempt]) -> ChargePlan:
    """The job's charge (``billing.services.charge_plan``), its
    ``tokens_billed`` and ``cost_nano`` set from it (not saved).

    ``attempts``: the job's attempts in offer order, with device, machine and
    receipt check. The sanity rules of the plan apply (a segment never bills
    more tokens than its characters, the job never more than ``max_tokens``);
    a segment they cut is written back, flagged. A spot check costs nobody
    anything, its hosts paid like any job's by the platform (DESIGN.md "Spot
    checks"); a job without a renter costs nothing.
    """
    segments = [segment_of(attempt) for attempt in attempts]
    plan = charge_plan(
        segments=segments,
        max_tokens=job.params.get("max_tokens"),
        price=job_price_nano(job),
    )
    for segment in plan.capped:
        Attempt.objects.filter(id=segment.attempt_id).update(
            tokens_billed=segment.tokens_billed, token_count_flagged=True
        )
    job.tokens_billed = plan.tokens
    job.cost_nano = 0 if job.is_spot_check or job.renter_id is None else plan.cost
    return plan


def job_charge(*, job: Job, plan: ChargePlan, now: datetime) -> None:
    """Post the job's charge ``plan`` (``job_charge_plan``;
    ``billing.services.charge_post``: once per job), counted to its key's
    spending cap (``caps.key_spend_add``); a spot check's hosts paid by the
    platform, nobody billed; a job without a renter, nothing."""
    if job.is_spot_check:
        charge_post(job_id=job.id, renter=None, model_id=job.model_id, plan=plan, now=now)
        return
    if job.renter_id is None:
        return
    posted = charge_post(
        job_id=job.id, renter=job.renter, model_id=job.model_id, plan=plan, now=now
    )
    if posted is not None:
        key_spend_add(key_id=job.api_key_id, cost_nano=plan.cost, now=now)


def job_price_nano(job: Job) -> int:
    """The completion price ``job`` is charged at, nano-USD per token: the one
    it was admitted at, else (a job stored before prices were kept on it) the
    catalog's."""
    if job.price_completion_nano is not None:
        return job.price_completion_nano
    return CatalogModel.objects.get(id=job.model_id).price_completion_nano


def renter_prompt_tokens(
    reports: list[tuple[str, int | None]],
    count: Callable[[], int | None],
    *,
    most: int | None = None,
    counted_without_report: bool = False,
) -> int:
    """The renter's prompt in tokens, for ``usage.prompt_tokens`` (not billed).

    ``reports``: (attempt kind, its host's reported prompt tokens or None) in
    offer order; ``count``: the model's tokenizer's count, or None; ``most``:
    a bound no honest count passes (``tokens.prompt_tokens_most``), None when
    unknown. A fresh attempt's report within ``most`` (past it, the host's
    word is not shown: counted instead; fresh-eyes review 3: 2,147,483,647
    reached a renter); a continuation's prompt also holds the text it continues,
    so with only continuations reporting the prompt is counted (their report
    when no tokenizer is known); with no report, counted only with
    ``counted_without_report`` (a job whose renter got output), else 0.
    """
    reported = [tokens for _, tokens in reports if tokens is not None]
    for kind, tokens in reports:
        if kind == Attempt.Kind.FRESH and tokens is not None:
            if most is None or tokens <= most:
                return tokens
            reported = [t for t in reported if t <= most]
            break
    if not reported and not counted_without_report:
        return 0
    counted = count()
    if counted is not None:
        return counted
    return reported[0] if reported else 0


def attempts_reap(*, now: datetime | None = None) -> int:
    """Close jobs whose owning coroutine died (lease expired) and their open
    attempts; return the number closed.

    Attempts end ``cancelled`` (not the host's fault, not scored), their slots
    free, the job ends ``failed`` (``coordinator_lost``), billed for nothing it
    did not record.
    """
    now = now or timezone.now()
    closed = 0
    stale = Job.objects.filter(status__in=Job.OPEN_STATUSES, lease_until__lt=now)
    for job_id in stale.values_list("id", flat=True):
        # what its ended attempts recorded delivering (the open one recorded none)
        delivered = "".join(
            Attempt.objects.filter(job_id=job_id, state=Attempt.State.ENDED)
            .order_by("offered_at", "id")
            .values_list("output_text", flat=True)
        )
        job = job_finish(
            job_id=str(job_id),
            status=Job.Status.FAILED,
            output_text=delivered,
            error_code="coordinator_lost",
            error_message="the coordinator process running this job stopped",
            now=now,
        )
        closed += job.finished_at == now
    return closed
