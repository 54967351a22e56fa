"""Dispatch: the pick and the claim of a slot for a job, in one statement
(DESIGN.md "How a request flows" step 2, "Picking a device", "No eligible device").
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection
from django.utils import timezone

from ballast.writes import insert_sql, update_then

from catalog.models import CatalogModel
from hosts.models import Device, Machine
from hosts.services import spot_check_mark_due

from ..formats import response_format_of
from ..models import Attempt, Job
from ..selectors import (
    device_pick_sql,
    devices_eligible_count,
    devices_untried_exist,
    requirement_unmet,
    tiebreak_step,
)
from ..tokens import token_count
from .deadlines import claim_deadline


@dataclass(frozen=True)
class Dispatch:
    """The result of ``job_dispatch``: exactly one of attempt / wait / impossible.

    ``attempt`` with the ``offer`` frame to send to ``machine_channel``; ``wait``
    (capacity may come; ``contended``: a free slot exists whose row another
    dispatch holds locked right now); ``impossible`` naming the requirement no
    live device meets (``exhausted``: every device that could serve it has
    already failed it).
    """

    attempt: Attempt | None = None
    machine_channel: str = ""
    offer: dict | None = None
    wait: bool = False
    contended: bool = False
    exhausted: bool = False
    impossible: str = ""


def job_dispatch(
    *,
    job: Job,
    model: CatalogModel | None = None,
    continue_from: str = "",
    waiting_channel: str = "",
    now: datetime | None = None,
) -> Dispatch:
    """Pick an eligible device for ``job`` and claim one of its slots, atomically.

    A fresh serverless dispatch waits behind older queued jobs of the same model
    (first come, first served); a continuation, a spot check or a rental's job
    (their own device) does not. ``continue_from``: the text the renter already
    received (a continuation's attempt). At ``BALLAST_CANARY_RATE`` a spot check
    is marked due on the device claimed. ``waiting_channel``: noted on a job
    that waits, to be woken when a slot frees. ``model``: the job's catalog
    model, read here when not given. ``job`` may be unsaved (the request's
    new job, ``requests.job_build``): it is stored with the claim, running or
    queued. Joins the caller's transaction; outside one, the claim with its
    attempt and the job's row is atomic on its own (``device_claim``: one
    statement on PostgreSQL) and needs none.
    """
    now = now or timezone.now()
    if model is None:
        model = CatalogModel.objects.get(id=job.model_id)
    fcfs = not continue_from and not job.target_device_id
    offered_at = timezone.now()  # the claim's own time, whatever ``now`` says
    attempt = Attempt(
        job=job,
        kind=Attempt.Kind.CONTINUATION if continue_from else Attempt.Kind.FRESH,
        continue_from_chars=len(continue_from),
        offered_at=offered_at,
        claim_deadline=claim_deadline(offered_at),
    )
    device = device_claim(
        job=job,
        model=model,
        now=now,
        fcfs=fcfs,
        attempt=attempt,
        failed_over=job.failed_over or bool(continue_from),
    )
    if device is None:
        ahead = jobs_ahead_count(job=job, now=now) if fcfs else 0
        return _dispatch_unclaimed(
            job=job,
            model=model,
            now=now,
            ahead=ahead,
            waiting_channel=waiting_channel,
        )
    if not job.is_spot_check and random.random() < settings.BALLAST_CANARY_RATE:
        spot_check_mark_due(device_id=device.id, reason="rate", now=now)
    return Dispatch(
        attempt=attempt,
        machine_channel=device.machine.channel_name,
        offer=offer_frame(
            job=job,
            attempt=attempt,
            device_index=device.index,
            continue_from=continue_from,
        ),
    )


# what the claim returns of the claimed device (``update_then``'s columns)
_CLAIMED = ("id", "index", "machine_id", "channel_name")


def device_claim(
    *,
    job: Job,
    model: CatalogModel,
    now: datetime,
    fcfs: bool = False,
    attempt: Attempt | None = None,
    failed_over: bool = False,
) -> Device | None:
    """Take a slot of the best eligible device for ``job``: the pick and the
    claim are one statement, on PostgreSQL (the picked row locked ``SKIP
    LOCKED``: concurrent claims pass over each other's rows) and SQLite (one
    writer) alike. With ``fcfs``, the first devices are left to the serverless
    jobs of the model queued before it (``jobs_ahead_count``, counted in the
    same statement).

    The slot is taken only while ``slots_used < slots_total``; the claimed
    row's tie-break key moves on by ``selectors.tiebreak_step()``. With
    ``attempt`` (unsaved, its device unset), it is stored on the device
    claimed and the job marked running (``failed_over``), in the same
    statement (``ballast.writes.update_then``); an unsaved ``job`` is stored there
    too, running, or queued when nothing was claimed. Returns the device (its
    id, index and machine's channel read; the rest on access), or None when no
    eligible device was free.
    """
    new = job._state.adding
    if new and attempt is None:
        raise ValueError("an unsaved job is stored with its first attempt")
    # first: the job's ``created_at`` is set here, and the queue ahead counts by it
    steps = [_job_insert_sql(job)] if new else []
    if fcfs:
        ahead, ahead_params = _jobs_ahead_sql(job=job, now=now)
    else:
        ahead, ahead_params = "0", []
    pick, params = device_pick_sql(job=job, model=model, now=now, offset=ahead)
    steps.append(
        (
            "UPDATE hosts_devicemodel SET tiebreak = tiebreak + %s"
            " WHERE device_id = (SELECT id FROM claimed) AND model_id = %s",
            [tiebreak_step(), model.id],
        )
    )
    if attempt is not None:
        sql, attempt_params = insert_sql(
            attempt, exprs={"device_id": ("claimed.id", [])}
        )
        steps.append((sql + " FROM claimed", attempt_params))
        if not new:
            steps.append(
                (
                    "UPDATE jobs_job SET status = %s, failed_over = %s"
                    " WHERE id = %s AND EXISTS (SELECT 1 FROM claimed)",
                    [Job.Status.RUNNING, failed_over, _db_id(job.pk)],
                )
            )
    row = update_then(
        (
            "UPDATE hosts_device SET slots_used = slots_used + 1"
            f" WHERE slots_used < slots_total AND id = ({pick})"
            ' RETURNING id, "index", machine_id, (SELECT channel_name'
            " FROM hosts_machine WHERE id = hosts_device.machine_id) AS channel_name",
            [*params, *ahead_params],
        ),
        _CLAIMED,
        steps,
    )
    if new:
        job._state.adding, job._state.db = False, DEFAULT_DB_ALIAS
    if row is None:
        if new:
            job.status = Job.Status.QUEUED
        return None
    device_id, index, machine_id, channel = row
    machine_id = Machine._meta.pk.to_python(machine_id)  # SQLite: its hex
    # (from_db takes the values in the model's field order)
    device = Device.from_db(
        DEFAULT_DB_ALIAS, ["id", "machine_id", "index"], [device_id, machine_id, index]
    )
    device.machine = Machine.from_db(
        DEFAULT_DB_ALIAS, ["id", "channel_name"], [machine_id, channel]
    )
    if attempt is not None:
        attempt.device = device
        attempt._state.adding, attempt._state.db = False, DEFAULT_DB_ALIAS
        job.status, job.failed_over = Job.Status.RUNNING, failed_over
    return device


def _job_insert_sql(job: Job) -> tuple[str, list]:
    """The INSERT of the unsaved ``job`` (``ballast.writes.insert_sql``), its status
    running when the statement claimed a slot, else queued."""
    return insert_sql(
        job,
        exprs={
            "status": (
                "CASE WHEN EXISTS (SELECT 1 FROM claimed) THEN %s ELSE %s END",
                [Job.Status.RUNNING, Job.Status.QUEUED],
            )
        },
    )


def _jobs_ahead_sql(*, job: Job, now: datetime) -> tuple[str, list]:
    """The SQL counting ``jobs_ahead_count``'s jobs, and its params."""
    return (
        "(SELECT COUNT(*) FROM jobs_job WHERE model_id = %s AND status = %s"
        " AND target_device_id IS NULL AND created_at < %s AND lease_until > %s)",
        [
            job.model_id,
            Job.Status.QUEUED,
            connection.ops.adapt_datetimefield_value(job.created_at),
            connection.ops.adapt_datetimefield_value(now),
        ],
    )


def jobs_ahead_count(*, job: Job, now: datetime) -> int:
    """How many serverless jobs of ``job``'s model, queued before it with a live
    lease, it waits behind (first come, first served)."""
    sql, params = _jobs_ahead_sql(job=job, now=now)
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + sql, params)
        return cursor.fetchone()[0]


WOKEN_PER_SLOT = 2
"""Queued jobs a freed slot wakes: more than one (a woken job may find it
taken or no longer fit), never all (no stampede of dispatches)."""


def jobs_waiting_channels(*, model_id: str, limit: int) -> list[str]:
    """The channels of the oldest jobs queued for ``model_id`` with a live lease
    (first come, first served), at most ``limit``: the ones a freed slot wakes."""
    with connection.cursor() as cursor:  # a fixed statement: every job's end runs it
        cursor.execute(
            _WAITING_CHANNELS_SQL,
            [
                model_id,
                Job.Status.QUEUED,
                connection.ops.adapt_datetimefield_value(timezone.now()),
                limit,
            ],
        )
        return [channel for (channel,) in cursor.fetchall()]


_WAITING_CHANNELS_SQL = (
    "SELECT waiting_channel FROM jobs_job WHERE model_id = %s AND status = %s"
    " AND lease_until > %s AND waiting_channel <> '' ORDER BY created_at LIMIT %s"
)


def _dispatch_unclaimed(
    *, job: Job, model: CatalogModel, now: datetime, ahead: int, waiting_channel: str
) -> Dispatch:
    """The dispatch when no slot was claimed: impossible (DESIGN.md "No eligible
    device"), exhausted, contended (a free row another dispatch holds) or a wait."""
    unmet = requirement_unmet(
        model=model,
        placement=job.placement,
        now=now,
        target_device_id=job.target_device_id,
        features=job.features_needed,
    )
    if unmet:
        return Dispatch(impossible=unmet)
    if not devices_untried_exist(job=job, model=model, now=now):
        return Dispatch(
            impossible="every live device that can serve this request has "
            "already failed it",
            exhausted=True,
        )
    # eligible rows the claim passed over are locked by another dispatch now
    if devices_eligible_count(job=job, model=model, now=now) > ahead:
        return Dispatch(wait=True, contended=True)
    if waiting_channel and job.waiting_channel != waiting_channel:
        Job.objects.filter(id=job.id).update(waiting_channel=waiting_channel)
        job.waiting_channel = waiting_channel
    return Dispatch(wait=True)


def offer_frame(
    *, job: Job, attempt: Attempt, device_index: int, continue_from: str
) -> dict:
    """The ``offer`` frame of an attempt (PROTOCOL.md §2), one shape for every job.

    A continuation's ``max_tokens`` is what the renter's budget has left after
    the text already received (counted with the model's tokenizer where known).
    ``response_format`` and ``logprobs`` (alternatives per token) are there
    when the request asked for them; a continuation's output must go on under
    the same ``response_format`` from ``continue_from``.
    """
    max_tokens = job.params.get("max_tokens")
    if continue_from and max_tokens:
        spent = token_count(job.model_id, continue_from)
        max_tokens = max(1, max_tokens - (spent if spent is not None else 0))
    frame = {
        "type": "offer",
        "job": str(attempt.id),
        "device": device_index,
        "model": job.model_id,
        "params": {
            "max_tokens": max_tokens,
            "temperature": job.params.get("temperature"),
            "top_p": job.params.get("top_p"),
            "stop": job.params.get("stop"),
            "seed": job.params.get("seed"),
        },
        "continue_from": continue_from,
    }
    # what the output must be beyond text, only when asked (an offer of a plain
    # request is as it always was): docs/protocol-notes.md "Output features"
    response_format = response_format_of(job.params)
    if response_format:
        frame["response_format"] = response_format
    if job.params.get("logprobs") is not None:
        frame["logprobs"] = job.params["logprobs"]
    if job.messages is not None:
        frame["messages"] = job.messages
    else:  # a completion, or a chat its model's template rendered (tools)
        frame["prompt"] = job.prompt
    return frame


def _db_id(value):
    """A UUID primary key as this database stores it (its field's prep value)."""
    return Job._meta.pk.get_db_prep_value(value, connection)
