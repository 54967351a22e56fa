"""Attempt transitions: claimed by its host, ended with an outcome (DESIGN.md
"When a host fails", "Money"). Every state change is settled on the attempt's
state in the database (a compare-and-set; its end, a locked read of the open
attempt and one write): frames for an attempt that already ended change nothing."""

from __future__ import annotations

import functools
import logging
import uuid
from datetime import datetime

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from ballast import metrics
from ballast.db import for_update
from ballast.rows import columns, instances
from ballast.writes import row_update
from hosts.models import CoordinatorLease, Device, Machine
from hosts.services import device_outcome_record, device_speed_record

from ..formats import answer_ruled_out
from ..hooks import TrustHook, hook
from ..models import Attempt, Job
from .attempt_receipts import cancel_receipt_check, receipt_judge
from .deadlines import first_token_deadline
from .segments import segment_canonical, segment_continued_from, segment_tokens

log = logging.getLogger("ballast.jobs")


def attempt_claim(
    *, attempt_id: str, machine_id: str, now: datetime | None = None
) -> bool:
    """Move an offered attempt of this machine to claimed and set its first-token
    deadline; False when it is not this machine's or not offered any more.

    The state test stays in the UPDATE's own WHERE and the machine's devices are
    a subquery (PostgreSQL re-checks an UPDATE's own conditions against a row
    another transaction just ended, not a join's): a late claim never reopens
    an ended attempt.
    """
    now = now or timezone.now()
    try:
        attempt, machine = uuid.UUID(attempt_id), uuid.UUID(str(machine_id))
    except (ValueError, TypeError):  # not a UUID: no such attempt
        return False
    prep = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:  # a fixed statement: every job runs it
        cursor.execute(
            _CLAIM_SQL,
            [
                Attempt.State.CLAIMED,
                prep(now),
                prep(first_token_deadline(now)),
                Attempt._meta.pk.get_db_prep_value(attempt, connection),
                Attempt.State.OFFERED,
                Machine._meta.pk.get_db_prep_value(machine, connection),
            ],
        )
        return cursor.rowcount > 0


_CLAIM_SQL = (
    "UPDATE jobs_attempt SET state = %s, claimed_at = %s, first_token_deadline = %s"
    " WHERE id = %s AND state = %s"
    " AND device_id IN (SELECT id FROM hosts_device WHERE machine_id = %s)"
)


def empty_answer_explained(params: dict) -> bool:
    """Whether the request itself explains an answer with no text (DESIGN.md
    "Money": a failure the renter caused never counts against a host):
    ``max_tokens`` too few to complete one character (a UTF-8 character is up
    to 4 bytes, a token at least one). Such an empty answer is the answer
    (``failover.after_empty_answer``). A ``stop`` sequence explains nothing by
    itself: that one matched at the start is the host's word (its ids of the
    cut tokens are not sent), so another device is asked as for any empty
    answer, and a second empty one is the answer."""
    return (params.get("max_tokens") or 4) < 4


@transaction.atomic(savepoint=False)  # inside a job's end: no savepoint of its own
def attempt_end(
    *,
    attempt_id: str,
    outcome: str,
    output_text: str = "",
    error: str = "",
    done: dict | None = None,
    claimed_at: datetime | None = None,
    first_token_at: datetime | None = None,
    now: datetime | None = None,
    cancel_receipt: dict | None = None,
    device_records_later: bool = False,
) -> Attempt | None:
    """End an open attempt with ``outcome``; free its slot; record the outcome
    for the device's score (not a cancel, not an empty answer, not a spot check:
    a spot check's outcome is its verdict). Returns the ended attempt, or None
    when it had ended already (late frames change nothing).

    ``device_records_later``: the device's records (its outcome and score with
    the slot given back, its measured speed: ``_device_records``) are left to
    the caller as the returned attempt's ``device_records``, a callable it runs
    later in this transaction; else they are written here and it is None. A
    job's end runs it just before the charge, so the device's row, which every
    other end on the device waits for, is locked only from there to the commit
    (lock order: attempt, job, device, renter). Only inside the caller's own
    transaction: alone, the attempt would commit with its slot still held.

    ``output_text``: exactly what this attempt delivered to the renter.
    ``claimed_at``: when the host's claim reached the job's coroutine (kept
    unless the consumer recorded it first); ``first_token_at``: when its first
    token reached the coordinator. ``done``: the host's done frame
    (``finish_reason``, ``prompt_tokens``, ``completion_tokens``, ``receipt``):
    its receipt is checked against the machine's pinned key over that exact
    text and its count for believability. ``cancel_receipt``: the host's answer
    to a cancel of a segment the renter received (``prompt_tokens``,
    ``completion_tokens``, ``receipt``, ``text``: all the host sent, of which
    ``output_text`` is the start; None when its connection could not keep it),
    checked the same way over ``text`` (``cancel_receipt_check``) when ``done``
    carries no receipt: a valid one pays the host for ``output_text`` as a
    ``done`` would (``billing.services.charge_plan``).
    """
    now = now or timezone.now()
    # the open attempt locked as it is read (a late frame's end waits, then
    # finds it ended); its end is written once, below, with what it billed
    attempt = _attempt_open_locked(attempt_id)
    if attempt is None:
        return None
    attempt.state = Attempt.State.ENDED
    attempt.outcome = outcome
    attempt.ended_at = now
    attempt.output_text = output_text
    attempt.output_chars = len(output_text)
    attempt.error_message = error[:2000]
    if first_token_at:
        attempt.first_token_at = first_token_at
    if claimed_at and attempt.claimed_at is None:
        attempt.claimed_at = claimed_at
    metrics.attempt_ended(outcome=outcome, kind=attempt.kind)
    reported = done["completion_tokens"] if done else None
    token_ids = done.get("token_ids") if done else None
    params = attempt.job.params or {}
    budget = params.get("max_tokens")
    canonical = segment_canonical(attempt.job)
    attempt.tokens_billed, attempt.token_count_flagged = segment_tokens(
        model_id=attempt.job.model_id,
        text=output_text,
        reported=reported,
        token_ids=token_ids,
        continue_from=segment_continued_from(attempt) if token_ids else "",
        canonical=canonical,
        budget=budget,
    )
    ruled_out = (
        answer_ruled_out(params, output_text, done["finish_reason"], token_ids)
        if done
        and done.get("receipt") is not None  # (the host's, not the coordinator's cut)
        and outcome == Attempt.Outcome.SUCCEEDED
        and attempt.kind == Attempt.Kind.FRESH
        else ""
    )
    if ruled_out:  # nothing an honest engine wrote under its response_format
        attempt.tokens_billed = 0
        log.warning("attempt %s: %s", attempt.id, ruled_out)
    if done and done.get("receipt") is None:
        attempt.completion_tokens_reported = done["completion_tokens"]
        attempt.prompt_tokens_reported = done["prompt_tokens"]
        done = None  # the coordinator's own end (a max_tokens cut): no receipt
    if cancel_receipt is not None and done is None:
        cancel_receipt_check(
            attempt,
            output_text=output_text,
            answer=cancel_receipt,
            canonical=canonical,
        )
    if done:
        attempt.completion_tokens_reported = done["completion_tokens"]
        attempt.prompt_tokens_reported = done["prompt_tokens"]
        attempt.receipt = done.get("receipt", "")[:200]
        receipt_judge(
            attempt, completion_tokens=done["completion_tokens"], text=output_text
        )
    if attempt.token_count_flagged:
        log.warning("attempt %s: inflated token count %s", attempt.id, reported)
    job = attempt.job
    # an empty answer is no outcome of the host's either (DESIGN.md "Fair to
    # honest hosts": a prompt can make the model end at once); spot checks and
    # a second device's answer judge it (``failover.after_empty_answer``)
    not_the_devices = outcome in (Attempt.Outcome.CANCELLED, Attempt.Outcome.EMPTY_ANSWER)
    scored = not not_the_devices and not job.is_spot_check
    judged_bad = attempt.token_count_flagged or bool(ruled_out)
    flagged = judged_bad and not job.is_spot_check
    if flagged or not scored:
        # the slot first: the device's row before its device-model rows, as
        # the claim takes them (no lock cycle); a scored end gives it back
        # with the score (``device_outcome_record``'s ``slot_free``)
        Device.objects.filter(id=attempt.device_id, slots_used__gt=0).update(
            slots_used=F("slots_used") - 1
        )
    # what the checks of hosts' honesty keep of it (what a verifier would
    # score), and the failed check of a flagged count or of an answer its
    # response_format rules out (after the slot, as above)
    hook().attempt_ended(
        attempt=attempt, token_ids=token_ids, ruled_out=ruled_out, now=now
    )
    row_update(
        attempt,
        [
            *_ENDED_FIELDS,
            "tokens_billed",
            "token_count_flagged",
            "completion_tokens_reported",
            "prompt_tokens_reported",
            "receipt",
            "receipt_valid",
            *TrustHook.ATTEMPT_FIELDS,
        ],
    )
    records = functools.partial(
        _device_records,
        attempt,
        scored=scored,
        flagged=flagged,
        judged_bad=judged_bad,
        now=now,
    )
    attempt.device_records = records if device_records_later else None
    if not device_records_later:
        records()
    return attempt


def _device_records(
    attempt: Attempt, *, scored: bool, flagged: bool, judged_bad: bool, now: datetime
) -> None:
    """The device's records of its ended ``attempt`` (``attempt_end``): the
    outcome and score, with its slot given back unless ``flagged`` (then it
    was given back at once), when ``scored``; its measured speed after a
    success not ``judged_bad`` (an inflated count, an answer ruled out). The
    device's row first, then its device-model rows, as the claim takes them."""
    outcome, job = attempt.outcome, attempt.job
    succeeded = outcome == Attempt.Outcome.SUCCEEDED
    if scored:
        device_outcome_record(
            device_id=attempt.device_id,
            success=succeeded,
            reason=outcome,
            model_id=job.model_id,
            ttft_ms=attempt.ttft_ms if succeeded else None,
            now=now,
            slot_free=not flagged,
            job_ref=str(job.id),
            device=attempt.device,  # (read with the attempt, its machine's lease too)
        )
    if succeeded and not judged_bad:
        # the coordinator's own measure of the device (after its row above)
        device_speed_record(
            device_id=attempt.device_id,
            model_id=job.model_id,
            tokens=attempt.tokens_billed,
            seconds=(now - attempt.offered_at).total_seconds(),
            now=now,
        )


# an attempt's end reads the attempt with its job, device, machine and the
# machine's lease (``_attempt_open_locked``)
_OPEN_READ = (
    (Attempt, "a"),
    (Job, "j"),
    (Device, "d"),
    (Machine, "m"),
    (CoordinatorLease, "l"),
)


_OPEN = Attempt.OPEN_STATES


def _attempt_open_locked(attempt_id: str) -> Attempt | None:
    """The open attempt ``attempt_id`` with its job, device, machine and lease
    loaded, its row locked (``FOR NO KEY UPDATE``: a late frame's end waits,
    then finds it ended); None when it is not open. One fixed statement
    (``ballast.rows``)."""
    pk = Attempt._meta.pk
    sql = (
        f"SELECT {columns(*_OPEN_READ)} FROM {Attempt._meta.db_table} a"
        f" JOIN {Job._meta.db_table} j ON j.id = a.job_id"
        f" JOIN {Device._meta.db_table} d ON d.id = a.device_id"
        f" JOIN {Machine._meta.db_table} m ON m.id = d.machine_id"
        f" LEFT JOIN {CoordinatorLease._meta.db_table} l ON l.id = m.lease_id"
        f" WHERE a.id = %s AND a.state IN ({', '.join(['%s'] * len(_OPEN))})"
        f"{for_update('a', no_key=True)}"
    )
    params = [pk.get_db_prep_value(pk.to_python(attempt_id), connection), *_OPEN]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    attempt, job, device, machine, lease = instances(row, *_OPEN_READ)
    machine.lease = lease
    device.machine = machine
    attempt.device = device
    attempt.job = job
    return attempt


# what every attempt's end writes (``attempt_end``), with what it billed
_ENDED_FIELDS = (
    "state",
    "outcome",
    "ended_at",
    "output_text",
    "output_chars",
    "error_message",
    "first_token_at",
    "claimed_at",
)
