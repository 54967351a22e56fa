"""Writes of the job lifecycle: keys, jobs, dispatch (pick + claim), attempt ends.

DESIGN.md "How a request flows", "Picking a device", "When a host fails", "Money".
Races are settled in the database: the claim is one transaction (``SKIP LOCKED``
on PostgreSQL, the single writer on SQLite) and every state change of an attempt
is a compare-and-set on its state.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    close_old_connections,
    connection,
    transaction,
)
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from ballast import local
from ballast.db import (
    db_call,
    db_connection,
    db_datetime,
    db_uuid,
    execute_prepared,
    insert_leaves_out,
    lock_conflict,
    row_fetch,
    row_insert,
    row_saved,
    row_values,
    rows_changed,
    rows_fetch,
    sql_value,
    transaction_one_message,
    transaction_one_message_async,
    value_datetime,
    value_json,
    value_uuid,
)
from billing.models import Account, ReceiptCheck
from billing.services import (
    Segment,
    account_for,
    charge_plan,
    charge_post,
    job_charge,
    receipt_check,
    receipt_record,
    receipt_verdict,
)
from hosts.models import Device, Machine, token_hash, token_new
from hosts.services import device_outcome_record, spot_check_mark_due

from .models import ApiKey, Attempt, CatalogModel, Job, Rental
from .selectors import (
    device_claim,
    device_pick_params,
    device_pick_sql,
    devices_eligible_count,
    devices_untried_exist,
    requirement_unmet,
    tiebreak_step,
)
from .tokens import (
    prompt_token_count,
    prompt_tokens_least,
    prompt_tokens_most,
    token_count,
    token_count_believable,
)

log = logging.getLogger("ballast.jobs")

JOB_LEASE_S = 30.0
API_KEY_LAST_USED_EVERY = timedelta(minutes=1)  # last_used_at is written this often


# --- API keys ---------------------------------------------------------------------
def api_key_create(
    *, user: AbstractBaseUser, name: str = "default"
) -> tuple[ApiKey, str]:
    """Create an API key for ``user``; return it and the plain key (shown once)."""
    plain = token_new("bk")
    key = ApiKey.objects.create(
        user=user,
        name=name[:100] or "default",
        prefix=plain[:10],
        key_hash=token_hash(plain),
    )
    return key, plain


def api_key_authenticate(*, plain: str) -> ApiKey | None:
    """Return the live (not revoked) key for a plain API key, or None.

    The key comes with ``user`` (its renter) and ``last_used_stale`` (True when
    ``last_used_at`` is older than ``API_KEY_LAST_USED_EVERY`` or unset).
    """
    return api_key_and_model(plain=plain)[0]


# ``model`` not read by the caller (``job_open``): distinct from None (not in the catalog)
UNREAD = object()

_CATALOG_FIELDS = (
    "id",
    "context_length",
    "vram_per_request_mb",
    "price_completion_nano",
)


def api_key_and_model(
    *, plain: str, model_id: str | None = None
) -> tuple[ApiKey | None, CatalogModel | None]:
    """``api_key_authenticate`` and, in the same statement, the active catalog
    model ``model_id`` (as ``catalog_model_active``; None when it is not in the
    catalog, or when the key is not live or ``model_id`` is None)."""
    if not plain:
        return None, None
    # one fixed statement (the request path): the key, its renter, and whether its
    # last_used_at is due for a rewrite (``jobs.auth.LAST_USED_EVERY``)
    catalog_columns = "".join(f", c.{name}" for name in _CATALOG_FIELDS)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT k.id, k.user_id, k.name, k.prefix,"
            f" (k.last_used_at IS NULL OR k.last_used_at < %s){catalog_columns}"
            f" {_KEY_FROM_SQL} LEFT JOIN jobs_catalogmodel c ON c.id = %s AND c.active"
            f" WHERE {_KEY_WHERE_SQL}",
            [
                connection.ops.adapt_datetimefield_value(
                    timezone.now() - API_KEY_LAST_USED_EVERY
                ),
                model_id,
                token_hash(plain),
            ],
        )
        row = cursor.fetchone()
    if row is None:
        return None, None
    key = _api_key_row(*row[:5])
    model = None
    if row[5] is not None:
        model = _catalog_hints[row[5]] = CatalogModel.from_db(
            connection.alias, _CATALOG_FIELDS, row[5:]
        )
    return key, model


def _api_key_row(key_id, user_id, name, prefix, stale) -> ApiKey:
    """An ApiKey (with ``user`` and ``last_used_stale``) from its row as read."""
    # the fields not read here are deferred: loaded from the database if touched
    alias = DEFAULT_DB_ALIAS
    key = ApiKey.from_db(
        alias, ["id", "user_id", "name", "prefix"], [key_id, user_id, name, prefix]
    )
    key.user = get_user_model().from_db(alias, ["id", "is_active"], [user_id, True])
    key.last_used_stale = bool(stale)
    return key


# --- jobs ---------------------------------------------------------------------------
def job_create(**fields) -> Job:
    """Store a new queued job (``job_build(**fields)``: same arguments) with a
    lease held by the coroutine that will run it."""
    job = job_build(**fields)
    row_insert(job)  # the request path: no ORM compile (ballast.db)
    return job


def job_build(
    *,
    renter: AbstractBaseUser | None,
    api_key: ApiKey | None,
    model: CatalogModel,
    endpoint: str,
    messages: list[dict] | None,
    prompt: str | None,
    params: dict,
    placement: dict,
    stream: bool,
    is_spot_check: bool = False,
    rental=None,
    waiting_channel: str = "",
) -> Job:
    """The unsaved queued job ``job_create`` stores (its id set, its lease from now).

    A rental's job runs only on the rented device (``target_device``);
    ``waiting_channel`` is the channel of the coroutine that runs it, woken when a
    slot frees.
    """
    return Job(
        rental=rental,
        target_device_id=rental.device_id if rental is not None else None,
        waiting_channel=waiting_channel,
        renter=renter,
        api_key=api_key,
        model_id=model.id,
        price_completion_nano=model.price_completion_nano,
        endpoint=endpoint,
        messages=messages,
        prompt=prompt,
        params=params,
        placement=placement,
        stream=stream,
        is_spot_check=is_spot_check,
        lease_until=timezone.now() + timedelta(seconds=JOB_LEASE_S),
    )


def job_lease_renew(*, job_id: str) -> None:
    """Extend the lease of an open job (the owning coroutine is alive)."""
    Job.objects.filter(id=job_id, status__in=Job.OPEN_STATUSES).update(
        lease_until=timezone.now() + timedelta(seconds=JOB_LEASE_S)
    )


@dataclass(frozen=True)
class Dispatch:
    """The result of ``job_dispatch``: exactly one of attempt / wait / impossible."""

    attempt: Attempt | None = None
    machine_channel: str = ""
    offer: dict | None = None
    wait: bool = False
    contended: bool = False  # a free slot exists but another dispatch holds its row
    exhausted: bool = False  # every device that could serve it was tried
    impossible: str = ""
    offered: bool = False  # the offer went out already (the request step's early offer)


def offer_frame(
    *, job: Job, attempt: Attempt, device_index: int, continue_from: str
) -> dict:
    """The ``offer`` frame for an attempt (PROTOCOL.md §2), same shape for every job.

    A continuation's ``max_tokens`` is what the renter's budget has left after the
    text already received (counted with the model's tokenizer where known).
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
    if job.endpoint == Job.Endpoint.CHAT:
        frame["messages"] = job.messages
    else:
        frame["prompt"] = job.prompt
    return frame


def jobs_waiting_channels(*, model_id: str, limit: int) -> list[str]:
    """Channels of the oldest jobs queued for ``model_id`` (FCFS), at most ``limit``.

    One fixed statement: it runs whenever a slot frees, i.e. after every answer.
    """
    sql, params = _waiting_sql(model_id=model_id, now=timezone.now(), limit=limit)
    return [channel for channel, _ in rows_fetch(sql, params)]


def _waiting_sql(*, model_id: str, now: datetime, limit: int) -> tuple[str, list]:
    """(sql, params) selecting ``waiting_channel, created_at`` of the oldest
    ``limit`` jobs queued for ``model_id`` with a live lease, oldest first."""
    return (
        "SELECT waiting_channel, created_at FROM jobs_job"
        " WHERE model_id = %s AND status = %s AND lease_until > %s"
        " AND waiting_channel <> '' ORDER BY created_at LIMIT %s",
        [model_id, Job.Status.QUEUED, db_datetime(now), limit],
    )


def job_dispatch(
    *,
    job_id: str,
    continue_from: str = "",
    waiting_channel: str = "",
    job: Job | None = None,
    model: CatalogModel | None = None,
    now: datetime | None = None,
) -> Dispatch:
    """Pick an eligible device and claim one of its slots, atomically.

    ``job`` and ``model`` may be passed by a caller that holds them (the job's
    coroutine), saving two reads; only fields fixed at submission are used.

    A fresh dispatch waits behind older queued jobs of the same model (first come
    first served). Returns ``Dispatch(attempt=…)`` with the offer to send,
    ``Dispatch(wait=True)`` when capacity may come, or ``Dispatch(impossible=…)``
    naming the requirement no live device meets (DESIGN.md "No eligible device").

    On PostgreSQL the claim — queue count, pick, slot, attempt, job status — is
    one statement (``_dispatch_claim_statement``), atomic by itself: no
    transaction round trips, and inside a caller's transaction it simply joins
    it. On SQLite the same steps run in one (IMMEDIATE) transaction.
    """
    args = dict(
        job_id=job_id,
        continue_from=continue_from,
        waiting_channel=waiting_channel,
        job=job,
        model=model,
        now=now,
    )
    if connection.vendor == "postgresql":
        return _job_dispatch(**args)
    with transaction.atomic():
        return _job_dispatch(**args)


def _job_dispatch(
    *,
    job_id: str,
    continue_from: str,
    waiting_channel: str,
    job: Job | None,
    model: CatalogModel | None,
    now: datetime | None,
) -> Dispatch:
    now = now or timezone.now()
    job = job if job is not None else Job.objects.get(id=job_id)
    model = model if model is not None else CatalogModel.objects.get(id=job.model_id)
    # FCFS among serverless jobs only: a spot check or a rental's job runs on its
    # own device and neither waits behind nor holds back the others
    fcfs = not continue_from and not job.target_device_id
    attempt = _attempt_build(job, continue_from, now)
    if connection.vendor == "postgresql":
        ahead, device = _dispatch_claim_statement(
            job=job, model=model, now=now, fcfs=fcfs, attempt=attempt
        )
    else:
        ahead = _jobs_ahead(job=job, now=now).count() if fcfs else 0
        device = device_claim(job=job, model=model, now=now, skip=ahead)
        if device is not None:
            attempt.device = device
            attempt.save(force_insert=True)
            updates = {"status": Job.Status.RUNNING}
            if continue_from:
                updates["failed_over"] = True
            Job.objects.filter(id=job.id).update(**updates)
    if device is None:
        return _dispatch_unclaimed(
            job=job, model=model, now=now, ahead=ahead, waiting_channel=waiting_channel
        )
    return _dispatch_claimed(
        job=job, attempt=attempt, device=device, continue_from=continue_from, now=now
    )


def _attempt_build(job: Job, continue_from: str, now: datetime) -> Attempt:
    """The unsaved attempt a dispatch of ``job`` offers (its device set on claim)."""
    return Attempt(
        job=job,
        kind=Attempt.Kind.CONTINUATION if continue_from else Attempt.Kind.FRESH,
        continue_from_chars=len(continue_from),
        claim_deadline=now + timedelta(seconds=settings.BALLAST_CLAIM_TIMEOUT_S),
    )


def _spot_check_rolled() -> bool:
    """Whether a dispatch marks a spot check due on its device (at
    ``BALLAST_CANARY_RATE``, DESIGN.md "Spot checks")."""
    return random.random() < settings.BALLAST_CANARY_RATE


def _dispatch_claimed(
    *,
    job: Job,
    attempt: Attempt,
    device: Device,
    continue_from: str,
    now: datetime,
    spot_check_due: bool | None = None,
) -> Dispatch:
    """The dispatch of a claimed slot: the offer to send (and, at
    ``BALLAST_CANARY_RATE``, a spot check marked due on the device: rolled here
    unless the caller rolled it, ``spot_check_due``)."""
    if spot_check_due is None:
        spot_check_due = _spot_check_rolled()
    if spot_check_due and not job.is_spot_check:
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
    )
    if unmet:
        return Dispatch(impossible=unmet)
    if not devices_untried_exist(job=job, model=model, now=now):
        # every live device that could serve it has already failed it
        return Dispatch(
            impossible="every live device that can serve this request has "
            "already failed it",
            exhausted=True,
        )
    # rows another dispatch holds locked right now are capacity, not a wait
    contended = (
        connection.vendor == "postgresql"
        and devices_eligible_count(job=job, model=model, now=now) > ahead
    )
    return _dispatch_wait(job, waiting_channel, contended=contended)


def _jobs_ahead(*, job: Job, now: datetime):
    """Serverless jobs of the same model queued before ``job`` with a live lease."""
    return Job.objects.filter(
        model_id=job.model_id,
        status=Job.Status.QUEUED,
        target_device__isnull=True,
        created_at__lt=job.created_at,
        lease_until__gt=now,
    )


def _dispatch_claim_statement(
    *, job: Job, model: CatalogModel, now: datetime, fcfs: bool, attempt: Attempt
) -> tuple[int, Device | None]:
    """PostgreSQL: the whole claim of ``job_dispatch`` in one statement.

    One data-modifying CTE counts the jobs ahead (FCFS), picks and locks the best
    eligible device after them (``device_pick_sql``), takes its slot, moves its
    tie-break key on, inserts ``attempt`` (its fields as built by the caller, the
    device filled in) and marks the job running (``failed_over`` for a
    continuation). Returns ``(ahead, device)``: device (with its machine) is None
    when nothing was claimed, and then nothing was written.
    """
    claim = _ClaimStatement(job=job, model=model, now=now, fcfs=fcfs, attempt=attempt)
    job_set = "status = %s"
    if attempt.kind == Attempt.Kind.CONTINUATION:
        job_set += ", failed_over = true"
    sql, params = claim.sql(
        tail=f"job AS (UPDATE jobs_job j SET {job_set} FROM slot WHERE j.id = %s)",
        tail_params=[Job.Status.RUNNING, job.pk],
    )
    # planned once per connection and shape (planning it cost about as much as
    # running it): a SQL-prepared statement (ballast.db.execute_prepared)
    return claim.result(execute_prepared(sql, params)[0])


# of the claimed device and its machine, the fields a claim statement returns
_DEVICE_COLUMNS = ("id", "machine", "index", "name")
_MACHINE_COLUMNS = ("id", "name", "channel_name")
_DEVICE_INDEX = _DEVICE_COLUMNS.index("index")
_MACHINE_CHANNEL = _MACHINE_COLUMNS.index("channel_name")


@dataclass(frozen=True)
class GuessedPick:
    """The device a request step's claim is expected to take, offered the job
    before the claim answers (``job_open_by_key_async``'s guessed offer)."""

    device_id: int
    device_index: int
    machine_channel: str


@functools.cache
def _claim_fields() -> tuple[list, list]:
    """The fields of the device and of its machine a claim statement returns:
    what the dispatch needs (the offer's device index, the machine's channel;
    the rest deferred, read on access), so the statement's text stays under
    psycopg's cache limit (4,096 characters; past it every call parses the
    text again)."""
    return (
        [Device._meta.get_field(n) for n in _DEVICE_COLUMNS],
        [Machine._meta.get_field(n) for n in _MACHINE_COLUMNS],
    )


class _ClaimStatement:
    """PostgreSQL: the CTEs of a claim (``ahead``, ``pick``, ``slot``, ``bump``,
    ``attempt``) and the reading of the row the statement returns.

    ``gate``: SQL that must hold for anything to be picked (the request step's
    credit check); ``head``: CTEs placed before ``ahead`` (the gate's);
    ``offered_when_claimed``: the attempt's ``offered_at`` and claim deadline
    from the database's clock as the slot is taken, not ``now`` (the request
    step, which may wait for the renter's credit lock first). The
    statement returns ``*select`` (the caller's extra columns) then the jobs
    ahead, then the claimed device's and its machine's columns (NULL when no slot
    was claimed).

    ``guess``: the request step's guessed offer (``GuessedPick``; None when it
    offers nothing before the claim). The attempt is stored under
    ``attempt.id`` when the slot claimed is the guessed device's, and under
    ``guess_other_id`` otherwise (an id no host was ever offered: the guessed
    host's late frames can never pass for the attempt's); ``attempt_settle``
    sets ``attempt.id`` to the one stored (``guess_ids``: the request step's
    statement, one text whether it guessed or not).
    """

    def __init__(
        self,
        *,
        job: Job,
        model: CatalogModel,
        now: datetime,
        fcfs: bool,
        attempt: Attempt,
        gate: str = "",
        offered_when_claimed: bool = False,
        guess: GuessedPick | None = None,
        guess_ids: bool = False,
        build_sql: bool = True,
    ) -> None:
        """See the class docstring; ``build_sql`` False: only what reads the
        row is set, the text is built later (``sql_build``) or kept (the request
        step's, ``_OpenStatement``: ``params_kept``); ``ctes``, ``params`` and
        ``columns`` are then not set."""
        self.job, self.model, self.now = job, model, now
        self.fcfs, self.gate = fcfs, gate
        self.offered_when_claimed = offered_when_claimed
        self.guess = guess
        self.guess_other_id = uuid.uuid4() if guess_ids else None
        attempt.offered_at = timezone.now()
        self.attempt = attempt
        self.guess_id_read = guess_ids
        self.select_count = 0
        if build_sql:
            self.sql_build()

    def sql_build(self) -> None:
        """Build the claim's CTEs (``ctes``), their params (``params``) and
        the columns it returns (``columns``), field by field."""
        job, model, now, gate = self.job, self.model, self.now, self.gate
        guess, guess_ids, attempt = self.guess, self.guess_id_read, self.attempt
        offered_when_claimed = self.offered_when_claimed
        if self.fcfs:  # the query of _jobs_ahead, raw: it runs on every dispatch
            ahead_params = [job.model_id]
            queued = sql_value(Job.Status.QUEUED, ahead_params)
            ahead = (
                "SELECT count(*) AS n FROM jobs_job WHERE model_id = %s"
                f" AND status = {queued} AND target_device_id IS NULL"
                " AND created_at < %s AND lease_until > %s"
            )
            ahead_params += [job.created_at, now]
        else:
            ahead, ahead_params = "SELECT 0 AS n", []
        pick, pick_params = device_pick_sql(
            job=job, model=model, now=now, offset="(SELECT n FROM ahead)", gate=gate
        )
        db = db_connection()
        qn = db.ops.quote_name
        columns, values, attempt_params = [], [], []
        for field in Attempt._meta.concrete_fields:
            columns.append(qn(field.column))
            if field.attname == "device_id":
                values.append("slot.id")
                continue
            if field.attname == "id" and guess_ids:
                # the request step: one text whether a guess was offered or not
                values.append(
                    "CASE WHEN slot.id = %s AND (SELECT channel_name FROM"
                    " hosts_machine WHERE id = slot.machine_id) = %s"
                    " THEN %s ELSE %s END::uuid"
                )
                attempt_params += [
                    None if guess is None else guess.device_id,
                    None if guess is None else guess.machine_channel,
                    attempt.id,
                    self.guess_other_id,
                ]
                continue
            if offered_when_claimed and field.attname == "offered_at":
                # the claim's own time, not the statement's making: a request
                # may wait for its renter's credit lock first, and the offer's
                # time starts its claim deadline and its time to first token
                values.append("clock.t")
                continue
            if offered_when_claimed and field.attname == "claim_deadline":
                values.append("clock.t + %s * interval '1 second'")
                attempt_params.append(float(settings.BALLAST_CLAIM_TIMEOUT_S))
                continue
            value = sql_value(
                field.get_db_prep_save(getattr(attempt, field.attname), db),
                attempt_params,
            )
            if insert_leaves_out(field, value):
                columns.pop()
                continue
            values.append(value)
        device_fields, machine_fields = _claim_fields()
        self.ctes = (
            f"ahead AS ({ahead}),"
            f" pick AS ({pick}),"
            " slot AS (UPDATE hosts_device d SET slots_used = d.slots_used + 1 FROM pick"
            " WHERE d.id = pick.device_id AND d.slots_used < d.slots_total"
            " RETURNING " + ", ".join(f"d.{qn(f.column)}" for f in device_fields) + "),"
            " bump AS (UPDATE hosts_devicemodel dm SET tiebreak = dm.tiebreak + %s"
            " FROM pick, slot WHERE dm.id = pick.dm_id),"
            f" attempt AS (INSERT INTO jobs_attempt ({', '.join(columns)})"
            f" SELECT {', '.join(values)} FROM slot"
            # the claim's time, read once: offered_at and its deadline agree
            + (", (SELECT clock_timestamp() t) clock" if offered_when_claimed else "")
            + ")"
        )
        self.params = [*ahead_params, *pick_params, tiebreak_step(), *attempt_params]
        self.columns = "(SELECT n FROM ahead), slot.*, " + ", ".join(
            f"m.{qn(f.column)}" for f in machine_fields
        )

    def params_kept(self) -> list:
        """The params ``sql_build`` gives (``params``), in its order, without
        building the text: for a text built before with the same arguments, a
        request step's (FCFS, offered when claimed, the attempt's id guessed or
        not: ``_OpenStatement``, whose test holds the two equal). The job's
        ``created_at`` must be set (its ``pre_save``)."""
        if not (self.fcfs and self.offered_when_claimed and self.guess_id_read):
            raise RuntimeError(
                "params_kept: only a request step's claim keeps its text"
            )
        job, now, attempt, guess = self.job, self.now, self.attempt, self.guess
        return [
            # ahead (the FCFS count)
            job.model_id,
            job.created_at,
            now,
            # pick (``device_pick_sql``)
            *device_pick_params(job=job, model=self.model, now=now),
            tiebreak_step(),
            # the attempt's id (guessed or not), its job, its claim deadline
            None if guess is None else guess.device_id,
            None if guess is None else guess.machine_channel,
            attempt.id,
            self.guess_other_id,
            Attempt._meta.get_field("job").get_db_prep_save(
                attempt.job_id, db_connection()
            ),
            float(settings.BALLAST_CLAIM_TIMEOUT_S),
        ]

    def sql(
        self,
        *,
        head: str = "",
        head_params: list | None = None,
        tail: str,
        tail_params: list,
        select: tuple[str, ...] = (),
    ) -> tuple[str, list]:
        """(SQL, params) of the whole statement: ``WITH head, <claim CTEs>, tail``."""
        self.select_count = len(select)
        sql = (
            "WITH "
            + (head + ", " if head else "")
            + self.ctes
            + ", "
            + tail
            + " SELECT "
            + "".join(column + ", " for column in select)
            + self.columns
            + " FROM (SELECT 1) one LEFT JOIN slot ON true"
            " LEFT JOIN hosts_machine m ON m.id = slot.machine_id"
        )
        return sql, [*(head_params or []), *self.params, *tail_params]

    def _parts(self, row: tuple) -> tuple[int, tuple, tuple]:
        """(jobs ahead, the device's values, its machine's values) of the
        statement's row, past the caller's columns (``_DEVICE_COLUMNS``,
        ``_MACHINE_COLUMNS``; all NULL when no slot was claimed)."""
        row = row[self.select_count :]
        split = 1 + len(_DEVICE_COLUMNS)
        return row[0], row[1:split], row[split:]

    def attempt_settle(self, row: tuple) -> None:
        """Set ``attempt.id`` to the id the statement stored the attempt under
        (with ``guess_ids``: the guessed one only on the guessed device)."""
        if self.guess_id_read and not self.guessed(row):
            self.attempt.id = self.guess_other_id

    def guessed(self, row: tuple) -> bool:
        """Whether the slot claimed is the guessed device's (``guess``), on the
        machine connection it was offered on (a machine that reconnected
        meanwhile has another)."""
        if self.guess is None:
            return False
        _, device, machine = self._parts(row)
        return (
            device[0] == self.guess.device_id
            and machine[_MACHINE_CHANNEL] == self.guess.machine_channel
        )

    def claimed(self, row: tuple) -> bool:
        """Whether the statement's row (as ``result`` takes it) claimed a slot."""
        return self._parts(row)[1][0] is not None

    def target(self, row: tuple) -> tuple[int, str]:
        """(device index, machine channel) of the slot the row claimed: what an
        offer needs, read before ``result`` builds the objects."""
        _, device, machine = self._parts(row)
        return device[_DEVICE_INDEX], machine[_MACHINE_CHANNEL]

    def result(self, row: tuple) -> tuple[int, Device | None]:
        """``(ahead, device)`` from the statement's row (past the caller's columns);
        the device comes with its machine and is set on the attempt, or is None."""
        ahead, device_values, machine_values = self._parts(row)
        if device_values[0] is None:
            return ahead, None
        device_fields, machine_fields = _claim_fields()
        device = Device.from_db(
            DEFAULT_DB_ALIAS, [f.attname for f in device_fields], device_values
        )
        device.machine = Machine.from_db(
            DEFAULT_DB_ALIAS,
            [f.attname for f in machine_fields],
            machine_values,
        )
        self.attempt.device = device
        row_saved(self.attempt)
        return ahead, device


def _dispatch_wait(
    job: Job, waiting_channel: str, *, contended: bool = False
) -> Dispatch:
    if contended:
        return Dispatch(wait=True, contended=True)
    if waiting_channel and job.waiting_channel != waiting_channel:
        Job.objects.filter(id=job.id).update(waiting_channel=waiting_channel)
        job.waiting_channel = waiting_channel
    return Dispatch(wait=True)


# --- attempt transitions (compare-and-set on state) ----------------------------------
def attempt_claim(
    *, attempt_id: str, machine_id: str, now: datetime | None = None
) -> bool:
    """Move an offered attempt of this machine to claimed; False if it is not open.

    Sets the first-token deadline (claim + ``BALLAST_FIRST_TOKEN_TIMEOUT_S``). One
    fixed statement (it runs beside the first token of every answer; the ORM built
    it in ~4 ms of Python). The state test stays in the UPDATE's own WHERE and the
    machine's devices are a subquery, not a join: PostgreSQL does not re-check a
    ``WHERE id IN (SELECT …)`` against a row another transaction just ended, so a
    late claim could reopen an ended attempt (``test_claim_race``).
    """
    now = now or timezone.now()
    try:
        attempt, machine = db_uuid(attempt_id), db_uuid(machine_id)
    except ValueError:
        return False
    deadline = now + timedelta(seconds=settings.BALLAST_FIRST_TOKEN_TIMEOUT_S)
    return (
        rows_changed(
            "UPDATE jobs_attempt SET state = %s, claimed_at = %s,"
            " first_token_deadline = %s WHERE id = %s AND state = %s AND device_id IN"
            " (SELECT id FROM hosts_device WHERE machine_id = %s)",
            [
                Attempt.State.CLAIMED,
                db_datetime(now),
                db_datetime(deadline),
                attempt,
                Attempt.State.OFFERED,
                machine,
            ],
            prepare=True,  # beside every first token: planned once a connection
        )
        == 1
    )


def _segment_tokens(
    *, model_id: str, text: str, reported: int | None
) -> tuple[int, bool]:
    """Tokens to bill for a segment and whether the host's count was unbelievable.

    With a believable report, the report; otherwise the recount (or the characters,
    the ceiling, when no tokenizer is known).
    """
    if not text:
        return 0, bool(reported)
    recount = token_count(model_id, text)
    if reported is not None and token_count_believable(
        reported=reported, text=text, recount=recount
    ):
        return reported, False
    fallback = recount if recount is not None else len(text)
    return min(fallback, len(text)), reported is not None


def _attempt_end(
    *,
    attempt_id: str,
    outcome: str,
    output_text: str = "",
    error: str = "",
    done: dict | None = None,
    claimed_at: datetime | None = None,
    first_token_at: datetime | None = None,
    now: datetime | None = None,
) -> Attempt | None:
    """End an open attempt with ``outcome``; free its slot; record the outcome.

    ``output_text`` is exactly what this attempt delivered to the renter;
    ``claimed_at`` when the host's claim reached the job's coroutine (kept unless
    the consumer recorded it first), ``first_token_at`` when its first token
    reached the coordinator (kept in
    memory while streaming, so a token costs no database write). With a
    ``done`` (finish_reason, prompt/completion tokens, receipt) the receipt is
    verified against the machine's pinned key over that exact text and the count
    sanity-checked. Returns the ended attempt, or None when it was already ended
    (late frames change nothing).
    """
    now = now or timezone.now()
    updated = Attempt.objects.filter(
        id=attempt_id, state__in=Attempt.OPEN_STATES
    ).update(
        state=Attempt.State.ENDED,
        outcome=outcome,
        ended_at=now,
        output_text=output_text,
        output_chars=len(output_text),
        error_message=error[:2000],
        **({"first_token_at": first_token_at} if first_token_at else {}),
        # the consumer records a claim off the token path; a fast answer may end first
        **(
            {"claimed_at": Coalesce("claimed_at", Value(claimed_at))}
            if claimed_at
            else {}
        ),
    )
    if not updated:
        return None
    attempt = Attempt.objects.select_related("device__machine", "job").get(
        id=attempt_id
    )
    Device.objects.filter(id=attempt.device_id, slots_used__gt=0).update(
        slots_used=F("slots_used") - 1
    )
    reported = done["completion_tokens"] if done else None
    tokens, flagged = _segment_tokens(
        model_id=attempt.job.model_id, text=output_text, reported=reported
    )
    attempt.tokens_billed = tokens
    attempt.token_count_flagged = flagged
    if done:
        attempt.completion_tokens_reported = done["completion_tokens"]
        attempt.prompt_tokens_reported = done["prompt_tokens"]
        attempt.receipt = done.get("receipt", "")[:200]
        attempt.receipt_valid = (
            receipt_check(
                attempt=attempt,
                public_key_b64=attempt.device.machine.public_key,
                signature_b64=attempt.receipt,
                completion_tokens=done["completion_tokens"],
                text=output_text,
            )
            == ReceiptCheck.Verdict.VALID
        )
        if not attempt.receipt_valid:
            log.warning(
                "attempt %s: receipt missing or invalid; host not paid", attempt.id
            )
    if flagged:
        log.warning("attempt %s: unbelievable token count %s", attempt.id, reported)
    attempt.save(
        update_fields=[
            "tokens_billed",
            "token_count_flagged",
            "completion_tokens_reported",
            "prompt_tokens_reported",
            "receipt",
            "receipt_valid",
        ]
    )
    if (
        outcome not in (Attempt.Outcome.CANCELLED, Attempt.Outcome.EMPTY_ANSWER)
        and not attempt.job.is_spot_check
    ):
        # a spot check's outcome is its verdict (jobs.spotchecks.spot_check_judge);
        # an empty answer is not counted: a renter could cause it at will
        device_outcome_record(
            device_id=attempt.device_id,
            success=outcome == Attempt.Outcome.SUCCEEDED,
            reason=outcome,
            model_id=attempt.job.model_id,
            ttft_ms=attempt.ttft_ms if outcome == Attempt.Outcome.SUCCEEDED else None,
            now=now,
        )
    return attempt


attempt_end = transaction.atomic(_attempt_end)


def _job_finish(
    *,
    job_id: str,
    status: str,
    output_text: str,
    finish_reason: str = "",
    error_code: str = "",
    error_message: str = "",
    received: bool = True,
    now: datetime | None = None,
) -> Job:
    """Close a job once and charge what it delivered (DESIGN.md "Money").

    Cost = tokens billed over all its segments × the model's completion price; the
    charge is posted once per job whatever the caller retries. ``received=False``:
    the renter got none of ``output_text`` (a non-streamed answer whose renter
    left before its response): every segment is billed 0 tokens (each attempt
    keeps the text its host sent, for the record), the job's ``output_text`` is
    empty and nothing is charged or paid. A job already finished is returned
    unchanged.
    """
    now = now or timezone.now()
    job = Job.objects.select_for_update().get(id=job_id)
    if job.status not in Job.OPEN_STATUSES:
        return job
    model = CatalogModel.objects.get(id=job.model_id)
    attempts = list(job.attempts.all())
    still_open = [a for a in attempts if a.state in Attempt.OPEN_STATES]
    for attempt in still_open:
        attempt_end(
            attempt_id=str(attempt.id), outcome=Attempt.Outcome.CANCELLED, now=now
        )
    if not received:
        job.attempts.filter(tokens_billed__gt=0).update(tokens_billed=0)
        output_text = ""
    if still_open or not received:
        attempts = list(job.attempts.all())
    price = job_price_nano(job, model)
    job.tokens_billed = sum(a.tokens_billed for a in attempts)
    job.cost_nano = 0 if job.is_spot_check else job.tokens_billed * price
    in_order = sorted(attempts, key=lambda a: (a.offered_at, str(a.id)))
    job.prompt_tokens = _renter_prompt_tokens(
        [(a.kind, a.prompt_tokens_reported) for a in in_order],
        lambda: prompt_token_count(job.model_id, job.messages, job.prompt),
        counted_without_report=bool(output_text),  # a failure after output
    )
    job.status = status
    job.output_text = output_text
    job.finish_reason = finish_reason
    job.error_code = error_code
    job.error_message = error_message[:2000]
    job.finished_at = now
    job.save()
    job_charge(job=job, now=now, price_nano=price)
    return job


def _renter_prompt_tokens(
    reports: list[tuple[str, int | None]],
    count: Callable[[], int | None],
    *,
    counted_without_report: bool = False,
) -> int:
    """The renter's prompt in tokens, for a job's ``usage.prompt_tokens`` (not
    billed). ``reports``: (attempt kind, its host's reported prompt tokens or
    None) in offer order; ``count``: the model's tokenizer's count, or None.

    A fresh attempt's report; a continuation's prompt also holds the text it
    continues, so with only continuations reporting the prompt is counted
    (their report when no tokenizer is known); with no report, counted only
    with ``counted_without_report`` (a job whose renter got output), else 0.
    """
    reported = [tokens for _, tokens in reports if tokens is not None]
    for kind, tokens in reports:
        if kind == Attempt.Kind.FRESH and tokens is not None:
            return tokens
    if not reported and not counted_without_report:
        return 0
    counted = count()
    if counted is not None:
        return counted
    return reported[0] if reported else 0


def job_price_nano(job: Job, model: CatalogModel) -> int:
    """The completion price ``job`` is charged at, nano-USD per token: the one it
    was admitted at (``Job.price_completion_nano``), else the catalog's."""
    if job.price_completion_nano is not None:
        return job.price_completion_nano
    return model.price_completion_nano


job_finish = transaction.atomic(_job_finish)


@transaction.atomic
def job_succeed(
    *,
    job_id: str,
    attempt_id: str,
    segment_text: str,
    done: dict,
    answer_text: str,
    claimed_at: datetime | None = None,
    first_token_at: datetime | None = None,
) -> Job:
    """End a job's last attempt as succeeded and close the job, in one transaction.

    DESIGN.md "How a request flows", step 6: receipt and token sanity checked,
    then one transaction charges the renter, credits the host's hold and the
    platform, closes the attempt, frees the slot and records the outcome (the
    score recomputed with it). ``segment_text`` is what that attempt delivered,
    ``answer_text`` the whole answer (a continuation's prefix included), ``done``
    the host's done frame; see ``attempt_end`` and ``job_finish``. Returns the
    finished job, billed (fields other than its status, texts, token counts and
    cost may be deferred: read on access).

    The usual end (a renter's job, the attempt and job still open, no other
    attempt open) runs as fixed statements (``_job_succeed_fixed``, about a dozen);
    anything else takes ``attempt_end`` + ``job_finish``'s way. Both record the
    same rows.
    """
    end = dict(
        job_id=job_id,
        attempt_id=attempt_id,
        segment_text=segment_text,
        done=done,
        answer_text=answer_text,
        claimed_at=claimed_at,
        first_token_at=first_token_at,
    )
    job = _job_succeed_fixed(**end)
    return job if job is not None else _job_succeed_general(**end)


def job_succeed_waking(*, model_id: str, **end) -> tuple[Job, list[str]]:
    """``job_succeed(**end)``, then the channels of the jobs queued for
    ``model_id`` that its freed slot wakes (``jobs_waiting_channels``, read
    after the end committed: a job queued before it is seen), in one call.

    One worker-thread call for the end of an answer: the look-up costs one more
    round trip before ``[DONE]`` instead of a thread hop and a round trip after
    it, beside the renter's next request (docs/performance.md). Returns
    (the job as ``job_succeed``, at most two channels).
    """
    job = job_succeed(**end)
    return job, _slot_freed_look(model_id=model_id, limit=2)


def _slot_freed_look(*, model_id: str, limit: int) -> list[str]:
    """``jobs_waiting_channels``; when none waits (and guessed offers are on,
    on PostgreSQL, for a model whose catalog row this process holds), the same
    statement also reads the device the model's next claim would take and
    notes it for the next request's guessed offer (``_next_picks``): DESIGN.md
    "Picking a device" for a new serverless job with no placement, read without
    locking, after the answer's slot was freed."""
    model = _catalog_hints.get(model_id)
    if (
        model is None
        or not settings.BALLAST_GUESSED_OFFERS
        or connection.vendor != "postgresql"
    ):
        return jobs_waiting_channels(model_id=model_id, limit=limit)
    now = timezone.now()
    anyone = Job(model_id=model_id)
    anyone.id = None  # no attempt of it anywhere (rule 6)
    pick, pick_params = device_pick_sql(
        job=anyone,
        model=model,
        now=now,
        columns=f"d.id, d.{db_connection().ops.quote_name('index')}, m.channel_name",
        offset="0",
        lock=False,
    )
    waiting, waiting_params = _waiting_sql(model_id=model_id, now=now, limit=limit)
    (row,) = execute_prepared(
        f"WITH w AS ({waiting})"
        " SELECT ARRAY(SELECT waiting_channel FROM w ORDER BY created_at), p.*"
        f" FROM (SELECT 1) one LEFT JOIN ({pick}) p ON NOT EXISTS (SELECT 1 FROM w)",
        [*waiting_params, *pick_params],
    )
    channels, device_id, device_index, machine_channel = row
    if device_id is None:
        _next_picks.pop(model_id, None)
    else:
        pick = GuessedPick(
            device_id=device_id,
            device_index=device_index,
            machine_channel=machine_channel,
        )
        _next_picks[model_id] = (pick, time.monotonic() + GUESS_PICK_S)
    return list(channels)


def _job_succeed_general(
    *,
    job_id: str,
    attempt_id: str,
    segment_text: str,
    done: dict,
    answer_text: str,
    claimed_at: datetime | None = None,
    first_token_at: datetime | None = None,
) -> Job:
    """``job_succeed`` through ``_attempt_end`` and ``_job_finish`` (any case)."""
    _attempt_end(
        attempt_id=attempt_id,
        outcome=Attempt.Outcome.SUCCEEDED,
        output_text=segment_text,
        done=done,
        claimed_at=claimed_at,
        first_token_at=first_token_at,
    )
    return _job_finish(
        job_id=job_id,
        status=Job.Status.SUCCEEDED,
        output_text=answer_text,
        finish_reason=done["finish_reason"],
    )


# The job's attempts (offer order) with what their end and the charge need: the
# job, its price, its receipt checks, hosts, ledger accounts, and whether the new
# signature is already recorded (a replay).
_SUCCEED_READ_SQL = (
    "SELECT a.id, a.state, a.device_id, a.offered_at, a.first_token_at,"
    " a.tokens_billed, a.output_chars, a.token_count_flagged, a.receipt_valid,"
    " a.prompt_tokens_reported, rc.verdict, m.owner_id, m.public_key, ha.id,"
    " j.status, j.is_spot_check, j.renter_id, j.model_id, j.params,"
    " COALESCE(j.price_completion_nano, c.price_completion_nano),"
    " (SELECT r.id FROM billing_account r WHERE r.kind = %s AND r.user_id = j.renter_id),"
    " (SELECT p.id FROM billing_account p WHERE p.kind = %s AND p.user_id IS NULL),"
    " (SELECT COUNT(*) FROM billing_receiptcheck s WHERE s.signature = %s),"
    " a.kind"
    " FROM jobs_attempt a JOIN jobs_job j ON j.id = a.job_id"
    " JOIN hosts_device d ON d.id = a.device_id"
    " JOIN hosts_machine m ON m.id = d.machine_id"
    " LEFT JOIN billing_receiptcheck rc ON rc.attempt_id = a.id"
    " LEFT JOIN billing_account ha ON ha.kind = %s AND ha.user_id = m.owner_id"
    " LEFT JOIN jobs_catalogmodel c ON c.id = j.model_id"
    " WHERE a.job_id = %s ORDER BY a.offered_at, a.id"
)


def _job_succeed_fixed(
    *,
    job_id: str,
    attempt_id: str,
    segment_text: str,
    done: dict,
    answer_text: str,
    claimed_at: datetime | None,
    first_token_at: datetime | None,
) -> Job | None:
    """``job_succeed``'s usual case in fixed statements; None for any other case.

    One read (``_SUCCEED_READ_SQL``), then the attempt's compare-and-set UPDATE,
    its receipt check (``billing.services.receipt_record``), the outcome with the
    score and the slot (``hosts.services.device_outcome_record``), the job's
    compare-and-set UPDATE and the charge (``billing.services.charge_plan`` and
    ``charge_post``) — the rows ``_attempt_end`` + ``_job_finish`` write, the
    same values. Returns None, having written nothing, for a spot check, a job
    without a renter or price, an attempt not open or not the job's, or another
    attempt still open: the caller takes the general way.
    """
    now = timezone.now()
    receipt = done.get("receipt", "")[:200]
    signature = receipt or None
    rows = rows_fetch(
        _SUCCEED_READ_SQL,
        [
            Account.Kind.RENTER_CREDIT,
            Account.Kind.PLATFORM,
            signature,
            Account.Kind.HOST_HELD,
            db_uuid(job_id),
        ],
        prepare=True,
    )
    if not rows:
        return None
    attempt_uuid = value_uuid(attempt_id)
    (_, _, _, _, _, _, _, _, _, _, _, _, _, _, status, spot_check, renter_id,
     model_id, params, price, renter_account, platform_account, replays, _) = rows[0]  # fmt: skip
    mine = next((row for row in rows if value_uuid(row[0]) == attempt_uuid), None)
    if (
        mine is None
        or any(row[1] in Attempt.OPEN_STATES for row in rows if row is not mine)
        or mine[1] not in Attempt.OPEN_STATES
        or status not in Job.OPEN_STATUSES
        or spot_check
        or renter_id is None
        or price is None
    ):
        return None
    (_, _, device_id, offered_at, recorded_first_token, _, _, _, _, _, _,
     _, public_key, held_account, *_) = mine  # fmt: skip

    # the segment: token sanity and receipt (DESIGN.md "Money"), before any write
    reported = done["completion_tokens"]
    tokens, flagged = _segment_tokens(
        model_id=model_id, text=segment_text, reported=reported
    )
    verdict = receipt_verdict(
        signature=signature,
        replayed=bool(replays),
        public_key_b64=public_key,
        attempt_id=str(attempt_uuid),
        completion_tokens=reported,
        text=segment_text,
    )
    sets = [
        "state = %s, outcome = %s, ended_at = %s, output_text = %s,"
        " output_chars = %s, error_message = '', tokens_billed = %s,"
        " token_count_flagged = %s, completion_tokens_reported = %s,"
        " prompt_tokens_reported = %s, receipt = %s, receipt_valid = %s"
    ]
    values = [
        Attempt.State.ENDED,
        Attempt.Outcome.SUCCEEDED,
        db_datetime(now),
        segment_text,
        len(segment_text),
        tokens,
        flagged,
        reported,
        done["prompt_tokens"],
        receipt,
        verdict == ReceiptCheck.Verdict.VALID,
    ]
    if first_token_at:
        sets.append("first_token_at = %s")
        values.append(db_datetime(first_token_at))
    if claimed_at:
        # the consumer records a claim off the token path; a fast answer may end first
        sets.append("claimed_at = COALESCE(claimed_at, %s)")
        values.append(db_datetime(claimed_at))
    if not rows_changed(
        f"UPDATE jobs_attempt SET {', '.join(sets)}"
        " WHERE id = %s AND state IN (%s, %s, %s)",
        [*values, db_uuid(attempt_uuid), *Attempt.OPEN_STATES],
        prepare=True,
    ):
        return None  # ended meanwhile: nothing written here
    verdict_stands = receipt_record(
        attempt_id=attempt_uuid,
        device_id=device_id,
        signature=signature,
        verdict=verdict,
    )
    if verdict_stands != verdict:  # another done of it, or the signature, raced us
        rows_changed(
            "UPDATE jobs_attempt SET receipt_valid = %s WHERE id = %s",
            [verdict_stands == ReceiptCheck.Verdict.VALID, db_uuid(attempt_uuid)],
        )
        verdict = verdict_stands
    if verdict != ReceiptCheck.Verdict.VALID:
        log.warning("attempt %s: receipt missing or invalid; host not paid", attempt_id)
    if flagged:
        log.warning("attempt %s: unbelievable token count %s", attempt_id, reported)
    first_token = first_token_at or value_datetime(recorded_first_token)
    device_outcome_record(
        device_id=device_id,
        success=True,
        reason=Attempt.Outcome.SUCCEEDED,
        model_id=model_id,
        ttft_ms=(
            round((first_token - value_datetime(offered_at)).total_seconds() * 1000)
            if first_token
            else None
        ),
        now=now,
        slot_free=True,
    )

    # the job and its charge (DESIGN.md "Money"): every segment, this one as ended
    segments, prompt_reports = [], []
    for row in rows:
        is_mine = row is mine
        segments.append(
            Segment(
                attempt_id=value_uuid(row[0]),
                device_id=row[2],
                host_id=row[11],
                tokens_billed=tokens if is_mine else row[5],
                output_chars=len(segment_text) if is_mine else row[6],
                token_count_flagged=flagged if is_mine else bool(row[7]),
                receipt_valid=(
                    verdict == ReceiptCheck.Verdict.VALID
                    if is_mine
                    else (None if row[8] is None else bool(row[8]))
                ),
                verdict=verdict if is_mine else row[10],
                held_account_id=held_account if is_mine else row[13],
            )
        )
        prompt_reports.append((row[23], done["prompt_tokens"] if is_mine else row[9]))
    prompt_tokens = _renter_prompt_tokens(
        prompt_reports,
        lambda: prompt_token_count(
            model_id, *Job.objects.values_list("messages", "prompt").get(id=job_id)
        ),
    )
    params = value_json(params)
    plan = charge_plan(
        segments=segments, max_tokens=params.get("max_tokens"), price=price
    )
    for segment in plan.capped:
        rows_changed(
            "UPDATE jobs_attempt SET tokens_billed = %s, token_count_flagged = %s"
            " WHERE id = %s",
            [segment.tokens_billed, True, db_uuid(segment.attempt_id)],
        )
    finish_reason = done["finish_reason"]
    if not rows_changed(
        "UPDATE jobs_job SET status = %s, output_text = %s, finish_reason = %s,"
        " error_code = '', error_message = '', finished_at = %s,"
        " tokens_billed = %s, cost_nano = %s, prompt_tokens = %s"
        " WHERE id = %s AND status IN (%s, %s)",
        [
            Job.Status.SUCCEEDED,
            answer_text,
            finish_reason,
            db_datetime(now),
            plan.tokens,
            plan.cost,
            prompt_tokens or 0,
            db_uuid(job_id),
            *Job.OPEN_STATUSES,
        ],
        prepare=True,
    ):
        return Job.objects.get(id=job_id)  # finished meanwhile: returned unchanged
    if plan.cost > 0:
        users = get_user_model()
        for segment, _ in plan.shares:
            if segment.held_account_id is None:  # a host's first earning
                segment.held_account_id = account_for(
                    kind=Account.Kind.HOST_HELD, user=users(pk=segment.host_id)
                ).id
        charge_post(
            job_id=job_id,
            model_id=model_id,
            plan=plan,
            renter_account_id=renter_account
            or account_for(
                kind=Account.Kind.RENTER_CREDIT, user=users(pk=renter_id)
            ).id,
            platform_account_id=platform_account
            or account_for(kind=Account.Kind.PLATFORM).id,
            now=now,
        )
    return _job_partial(
        id=value_uuid(job_id),
        renter_id=renter_id,
        model_id=model_id,
        params=params,
        is_spot_check=False,
        status=Job.Status.SUCCEEDED,
        output_text=answer_text,
        finish_reason=finish_reason,
        error_code="",
        error_message="",
        finished_at=now,
        tokens_billed=plan.tokens,
        cost_nano=plan.cost,
        prompt_tokens=prompt_tokens or 0,
    )


def _job_partial(**values) -> Job:
    """A Job instance with these field values (attnames); the others are deferred."""
    names = [f.attname for f in Job._meta.concrete_fields if f.attname in values]
    return Job.from_db(connection.alias, names, [values[name] for name in names])


def attempts_reap(*, now: datetime | None = None) -> int:
    """Close jobs whose owning coroutine died (lease expired) and their open attempts.

    Attempts end as ``cancelled`` (not the host's fault, not counted in its score),
    their slots are freed, the job ends ``failed`` and is billed for nothing it did
    not record. Returns the number of jobs closed.
    """
    now = now or timezone.now()
    closed = 0
    stale = Job.objects.filter(status__in=Job.OPEN_STATUSES, lease_until__lt=now)
    for job_id in stale.values_list("id", flat=True):
        job = job_finish(
            job_id=str(job_id),
            status=Job.Status.FAILED,
            output_text="",
            error_code="coordinator_lost",
            error_message="the coordinator process running this job stopped",
            now=now,
        )
        closed += job.finished_at == now
    return closed


def credit_reserved_nano(*, renter) -> int:
    """What the renter's open commitments may still cost, nano-USD.

    The worst case (max_tokens × the price each was admitted at) of their jobs
    still open, plus the unbilled
    hours of their pending and live rentals. New requests and rentals are checked
    against the balance less this, so nothing taken in parallel can overspend.
    """
    open_jobs = list(
        Job.objects.filter(renter=renter, status__in=Job.OPEN_STATUSES).values_list(
            "model_id", "params", "price_completion_nano"
        )
    )
    prices = (
        dict(
            CatalogModel.objects.filter(
                id__in={model_id for model_id, _, _ in open_jobs}
            ).values_list("id", "price_completion_nano")
        )
        if open_jobs
        else {}
    )
    jobs = sum(
        (params.get("max_tokens") or 0)
        * (admitted if admitted is not None else prices.get(model_id, 0))
        for model_id, params, admitted in open_jobs
    )
    rentals = 0
    for rental in Rental.objects.filter(renter=renter, status__in=Rental.OPEN_STATUSES):
        hours_left = float(rental.hours)
        if rental.billed_until and rental.starts_at:
            billed = (rental.billed_until - rental.starts_at).total_seconds() / 3600
            hours_left = max(0.0, rental.hours - billed)
        rentals += int(hours_left * rental.price_per_hour_nano)
    return jobs + rentals


def _credit_sql(account_where: str, renter: str = "%s") -> str:
    """SELECT of (balance, open jobs' worst case, any open rental) of the renter's
    credit account ``a`` chosen by ``account_where``; ``renter``: SQL of the
    renter's user id (a parameter by default). Params: ``_credit_params`` (with
    the renter's id twice when it is a parameter), then the account's."""
    if connection.vendor == "postgresql":
        max_tokens = "(j.params->>'max_tokens')::bigint"
    else:
        max_tokens = "CAST(json_extract(j.params, '$.max_tokens') AS INTEGER)"
    return (
        "SELECT a.balance_nano AS balance,"
        f" (SELECT COALESCE(SUM(COALESCE({max_tokens}, 0)"
        "  * COALESCE(j.price_completion_nano, c.price_completion_nano)), 0)"
        "  FROM jobs_job j JOIN jobs_catalogmodel c ON c.id = j.model_id"
        f"  WHERE j.renter_id = {renter} AND j.status IN ({_OPEN_JOB_SQL}))"
        " AS reserved,"
        f" EXISTS (SELECT 1 FROM jobs_rental r WHERE r.renter_id = {renter}"
        f"  AND r.status IN ({_OPEN_RENTAL_SQL})) AS rentals"
        f" FROM billing_account a WHERE {account_where}"
    )


# the open statuses as literals, not parameters: a prepared statement's generic
# plan can then use the partial index of the renter's open jobs
# (``Job.Meta``'s ``job_open_by_renter``), whatever the renter's history
_OPEN_JOB_SQL, _OPEN_RENTAL_SQL = (
    ", ".join(sql_value(status, []) for status in statuses)
    for statuses in (Job.OPEN_STATUSES, Rental.OPEN_STATUSES)
)


def _credit_params(renter_id: int | None = None) -> list:
    """``_credit_sql``'s params before the account's (``renter_id``: when the
    renter is a parameter)."""
    return [] if renter_id is None else [renter_id, renter_id]


def credit_available_nano(*, renter, account_id: int) -> int:
    """The renter's balance less ``credit_reserved_nano``, nano-USD, in one read.

    ``account_id`` is the renter's credit account (``credit_lock``). The balance is
    the account's running ``balance_nano`` (kept by the database on every entry, so
    the check does not grow with the renter's history), the worst case of the open
    jobs is summed by the database; open rentals, rare, are added by
    ``credit_reserved_nano``'s own reads only when there are any.
    """
    balance, jobs_reserved, rentals_open = row_fetch(
        _credit_sql("a.id = %s"), [*_credit_params(renter.pk), account_id]
    )
    if rentals_open:
        return balance - credit_reserved_nano(renter=renter)
    return balance - jobs_reserved


# the renter's credit account, locked until the transaction ends (PostgreSQL)
_CREDIT_LOCK_SQL = "SELECT id FROM billing_account WHERE kind = %s AND user_id = %s"


def credit_lock(*, renter) -> int:
    """Lock the renter's credit account row until the transaction ends, so
    concurrent checks of one renter's credit run one after the other; return its id
    (the account is made on the renter's first request)."""
    from billing.services import account_for

    lock = (
        " FOR UPDATE" if connection.vendor == "postgresql" else ""
    )  # SQLite: one writer

    def locked_id() -> int | None:
        row = row_fetch(
            _CREDIT_LOCK_SQL + lock, [Account.Kind.RENTER_CREDIT, renter.pk]
        )
        return row[0] if row else None

    account_id = locked_id()
    if account_id is None:  # a renter's first request: make the account, lock it
        account_for(kind=Account.Kind.RENTER_CREDIT, user=renter)
        account_id = locked_id()
    return account_id


def job_open(
    *,
    api_key: ApiKey,
    request,
    waiting_channel: str,
    model: CatalogModel | None | object = UNREAD,
) -> tuple[Job, CatalogModel, Dispatch]:
    """Submit a renter's request and make its first dispatch, in one transaction.

    The request path's one database step before the offer goes out (DESIGN.md "How a
    request flows"): the job is stored with ``waiting_channel`` (the channel of the
    coroutine that will run it) and, when a device is free, its first attempt is
    claimed in the same commit. Returns (job, its catalog model, the dispatch: an
    attempt with its offer, a wait or an impossibility, as ``job_dispatch``).
    Raises ApiError as ``job_submit`` does; then nothing is stored. ``model``:
    the request's catalog model when the caller read it with the key
    (``api_key_and_model``: a CatalogModel, or None when it is not in the
    catalog); left out, it is read here.

    On PostgreSQL, outside a transaction, the common request (a renter whose
    credit account exists, no rental) takes the catalog read and one round trip
    (``_job_open_one_trip``); otherwise the same steps run one statement at a
    time (``_job_open_stepwise``). Either way the transaction commits without
    waiting for its WAL to reach the disk (``synchronous_commit`` off for it
    alone): it stores no money, and the end of the job, which does, commits
    synchronously and so makes it durable too (docs/performance.md).
    """
    if (
        connection.vendor == "postgresql"
        and not connection.in_atomic_block
        and not request.placement.get("rental")
    ):
        opened = _job_open_one_trip(
            api_key=api_key,
            request=request,
            waiting_channel=waiting_channel,
            model=model,
        )
        if opened is not None:
            return opened
    return _job_open_stepwise(
        api_key=api_key, request=request, waiting_channel=waiting_channel, model=model
    )


# SET LOCAL synchronous_commit TO OFF, as a function call (a row to read back,
# whichever way the statement is sent)
_ASYNC_COMMIT_SQL = "SELECT set_config('synchronous_commit', 'off', true)"


@transaction.atomic
def _job_open_stepwise(
    *, api_key: ApiKey, request, waiting_channel: str, model=UNREAD
) -> tuple[Job, CatalogModel, Dispatch]:
    """``job_open`` one statement at a time (SQLite; PostgreSQL's rarer cases)."""
    if connection.vendor == "postgresql":
        row_fetch(_ASYNC_COMMIT_SQL, [])
    job, model = job_submit(
        api_key=api_key, request=request, waiting_channel=waiting_channel, model=model
    )
    dispatch = job_dispatch(
        job_id=str(job.id), waiting_channel=waiting_channel, job=job, model=model
    )
    return job, model, dispatch


def _job_open_one_trip(
    *, api_key: ApiKey, request, waiting_channel: str, model=UNREAD
) -> tuple[Job, CatalogModel, Dispatch] | None:
    """PostgreSQL: ``job_open`` as the catalog read (unless given) and one round trip.

    The round trip (one message, ``ballast.db.transaction_one_message``) holds:
    the renter's credit lock, then one statement that reads the credit (after
    the lock is granted: its own snapshot), inserts the job only if the credit
    covers it, and claims a slot for it as ``job_dispatch`` does, with the pick
    gated on the same check.
    Returns None, having stored nothing, when ``_job_open_stepwise`` must do it
    (the renter's first request makes their credit account; an open rental
    changes the reservation). Raises ApiError 404, 400 and 402 as ``job_submit``.
    """
    model = _request_model(request, model)
    _request_fits(model, request)
    step = _OpenStatement(
        request=request,
        model=model,
        waiting_channel=waiting_channel,
        renter_sql="SELECT %s::bigint AS user_id, %s::bigint AS key_id",
        renter_params=[api_key.user_id, api_key.pk],
    )
    locked, row = step.send(
        _CREDIT_LOCK_SQL + " FOR UPDATE", [Account.Kind.RENTER_CREDIT, api_key.user_id]
    )
    if not locked:
        return None
    opened = step.result_closing(row, renter=api_key.user, api_key=api_key)
    return None if opened is None else (step.job, model, opened)


def job_open_by_key(
    *, plain: str, request, waiting_channel: str
) -> tuple[ApiKey, Job, CatalogModel, Dispatch] | None:
    """PostgreSQL: the whole request step — the API key, the credit, the job and
    its claim — in one round trip, for a model this process has read before.

    The catalog row read last time (``_catalog_hints``) shapes the statement, and
    the statement checks it is still the catalog's (active, same price, context
    and VRAM) before anything is stored; the key is checked there too (live, its
    renter active), and locks the renter's credit account. Returns (the key, then
    as ``job_open``), or None, having stored nothing, when the two-step way must
    answer (``api_key_and_model`` then ``job_open``): SQLite, a transaction
    already open, an unknown, revoked or first-time key, a model not read yet or
    changed since, a prompt that may not fit, an open rental. Raises ApiError
    402 as ``job_submit``.
    """
    if connection.in_atomic_block:
        return None
    begun = _key_step(plain=plain, request=request, waiting_channel=waiting_channel)
    if begun is None:
        return None
    step, lock = begun
    locked, row = step.send(*lock)
    if not locked:
        return None
    api_key = _api_key_row(*locked[0][1:], stale=False)  # written with the step
    opened = step.result_closing(row, renter=api_key.user, api_key=api_key)
    return None if opened is None else (api_key, step.job, step.model, opened)


async def job_open_by_key_async(
    *,
    plain: str,
    request,
    waiting_channel: str,
    offer_now=None,
    guessed_offer=None,
) -> tuple[ApiKey, Job, CatalogModel, Dispatch] | None:
    """``job_open_by_key`` awaited in the event loop: the statement built in the
    loop and its message sent on an ``AsyncConnection``
    (``ballast.db.transaction_one_message_async``), no worker thread, when the
    slot was claimed; the rarer endings that read or write more (no slot
    claimed: the wait or 503 look-ups; a spot check marked due at
    ``BALLAST_CANARY_RATE``) finish in a worker thread (``db_call``). Same
    arguments, result and errors.

    ``offer_now``: ``await offer_now(machine_channel, attempt_id, frame)`` sends
    the offer of a slot claimed with nothing more to decide, as soon as the
    database answered (``jobs.orchestration.EarlyOffer``), and returns whether
    it did; the dispatch returned is then ``offered``. When the step fails after
    that, the caller cancels the offer (the job is closed here).

    ``guessed_offer`` (``jobs.orchestration.EarlyOffer``'s ``guess_send``,
    ``guess_confirm``, ``guess_withdraw``): the offer goes out *before* the
    database answers, to the device the claim is expected to take
    (``_guess_take``: a key whose last step in this process stored its job, a
    next pick noted when the model's last answer here ended, a machine connected to
    this process), while the database checks the key and the credit and picks
    by its own rule (DESIGN.md "Picking a device"). Confirmed when the claim
    took that device (the dispatch is then ``offered``); withdrawn (cancelled on
    the host) otherwise, the attempt then stored under an id that host never
    saw. No output is relayed before the step answered.
    """
    spot_check_due = _spot_check_rolled()
    guessing = (
        guessed_offer is not None
        and offer_now is not None
        and not spot_check_due
        and settings.BALLAST_GUESSED_OFFERS
    )
    begun = _key_step(
        plain=plain, request=request, waiting_channel=waiting_channel, guessing=guessing
    )
    if begun is None:
        return None
    step, lock = begun
    guess, guess_sent = step.claim.guess, False
    try:
        if guess is not None:
            # the offer first: the host starts its prefill while the database
            # checks the key and the credit and claims
            frame = offer_frame(
                job=step.job,
                attempt=step.attempt,
                device_index=guess.device_index,
                continue_from="",
            )
            try:
                guess_sent = await guessed_offer.guess_send(
                    guess.machine_channel, str(step.attempt.id), frame
                )
            except Exception:  # a full inbox: the offer goes after the claim
                log.exception("job %s: its guessed offer failed", step.job.id)
        locked, row = await step.send_async(*lock)
        claimed = bool(locked) and step.claimed_plainly(row)
        _guess_note(step, accepted=bool(locked) and step.stored(row))
        if not locked:
            return None
        offered = None
        if guess_sent and claimed and step.claim.guessed(row):
            guessed_offer.guess_confirm()
            offered = guess.machine_channel
        elif guess_sent:
            await guessed_offer.guess_withdraw()  # before any offer of the claim
        try:
            if (
                offered is None
                and offer_now is not None
                and not spot_check_due
                and claimed
            ):
                # the offer first: what follows (the objects of the key, the
                # device, the job's coroutine) is built while the host works on it
                device_index, machine_channel = step.claim.target(row)
                frame = offer_frame(
                    job=step.job,
                    attempt=step.attempt,
                    device_index=device_index,
                    continue_from="",
                )
                if await offer_now(machine_channel, str(step.attempt.id), frame):
                    offered = machine_channel
            api_key = _api_key_row(*locked[0][1:], stale=False)  # written with the step

            def finish() -> Dispatch | None:
                return step.result(
                    row,
                    renter=api_key.user,
                    api_key=api_key,
                    spot_check_due=spot_check_due,
                )

            if spot_check_due or step.result_reads(row):
                opened = await db_call(finish)()
            else:
                opened = finish()
            if offered is not None:
                if opened is None or opened.machine_channel != offered:
                    raise RuntimeError("the request step's early offer went elsewhere")
                opened = dataclasses.replace(opened, offered=True)
        except Exception:
            if step.stored(row):
                await db_call(_job_close_stored)(step.job)
            raise
    finally:
        if guess_sent:  # a no-op once confirmed or withdrawn
            await guessed_offer.guess_withdraw()
    return None if opened is None else (api_key, step.job, step.model, opened)


# Guessed offers (``job_open_by_key_async``). A key is trusted for
# ``GUESS_KEY_TRUST_S`` after a step of it stored its job here, and no longer once
# a step of it is refused: a revoked key or a spent credit costs a host at most
# one withdrawn offer per process. A next pick (noted as an answer ends,
# ``_slot_freed_look``) is good for ``GUESS_PICK_S``
# (the database still decides; a stale one is only a withdrawn offer).
GUESS_KEY_TRUST_S = 60.0
GUESS_PICK_S = 10.0
GUESS_KEYS_MAX = 10_000
# key hash -> monotonic time until which its requests may be guessed
_keys_trusted: dict[str, float] = {}
# model id -> (the device its next claim should take, monotonic time it is good until)
_next_picks: dict[str, tuple[GuessedPick, float]] = {}


def _guess_take(key_hash: str, model_id: str, request) -> GuessedPick | None:
    """The device to offer a request before its step answers, or None: the key
    trusted here, no placement asked for (the next pick was judged without
    one), a next pick noted for the model (taken: one request per noted pick)
    and its machine connected to this process and idle
    (``ballast.local.reads_here``: its connection holds the claim's record
    until the step confirms it; an idle host has every slot free)."""
    if request.placement:
        return None
    now = time.monotonic()
    trusted = _keys_trusted.get(key_hash)
    if trusted is None or trusted < now:
        return None
    noted = _next_picks.pop(model_id, None)
    if noted is None or noted[1] < now:
        return None
    pick = noted[0]
    return pick if local.reads_here(pick.machine_channel, idle=True) else None


def _guess_note(step: _OpenStatement, *, accepted: bool) -> None:
    """After a request step answered: trust its key (the step stored its job:
    a live key, the credit covering it) or stop trusting it (no such key, or
    refused)."""
    if not accepted:
        _keys_trusted.pop(step.key_hash, None)
        return
    if len(_keys_trusted) >= GUESS_KEYS_MAX:
        _keys_trusted.clear()
    _keys_trusted[step.key_hash] = time.monotonic() + GUESS_KEY_TRUST_S


def _job_close_stored(job: Job) -> None:
    """Close ``job``, stored by the request step's message, when a later part of
    the step failed (a database error in the wait or 503 look-ups, say): the
    renter gets an error, so the job is failed (its slot freed, nothing billed)
    rather than left queued, holding its place ahead of the model's queue
    until its lease runs out. Tried twice (the second on another connection);
    a failure is logged and the lease and the reaper close it later."""
    for _ in range(2):
        try:
            job_finish(
                job_id=str(job.id),
                status=Job.Status.FAILED,
                output_text="",
                error_code="database_unavailable",
                error_message="the request step failed after the job was stored; "
                "nothing was billed",
            )
            return
        except DatabaseError:
            close_old_connections()
    log.error("job %s: could not be closed after its request step failed", job.id)


def _key_step(
    *, plain: str, request, waiting_channel: str, guessing: bool = False
) -> tuple[_OpenStatement, tuple[str, list]] | None:
    """``job_open_by_key``'s statement and its lock (sql, params), built without
    the database or the tokenizer (it runs in the event loop); None when the
    two-step way must answer (see there; also a prompt whose bytes alone may
    not fit the context: it is counted there). ``guessing``: the statement is
    built for the device ``_guess_take`` expects, if any (``step.claim.guess``)."""
    model = _catalog_hints.get(request.model)
    if (
        connection.vendor != "postgresql"
        or model is None
        or not plain
        or request.placement.get("rental")
    ):
        return None
    if not _request_fits_cheaply(model, request):
        return None  # the two-step way counts (or refuses) with the catalog's own row
    key_hash = token_hash(plain)
    step = _OpenStatement(
        request=request,
        model=model,
        waiting_channel=waiting_channel,
        renter_sql=f"SELECT k.user_id, k.id AS key_id {_KEY_FROM_SQL}"
        f" WHERE {_KEY_WHERE_SQL}",
        renter_params=[key_hash],
        guess=_guess_take(key_hash, model.id, request) if guessing else None,
    )
    step.key_hash = key_hash
    lock = (
        "SELECT a.id, k.id, k.user_id, k.name, k.prefix"
        f" {_KEY_FROM_SQL} JOIN billing_account a ON a.user_id = k.user_id"
        f" AND a.kind = %s WHERE {_KEY_WHERE_SQL} FOR UPDATE OF a",
        [Account.Kind.RENTER_CREDIT, key_hash],
    )
    # the key's last_used_at, in the same message, when it is due (at most once
    # a minute: ``jobs.auth.api_key_mark_used``'s rule; the server's clock)
    step.also.append((_KEY_USED_SQL, [key_hash], True))
    return step, lock


# a live API key's last use (by its hash), when it is older than the rule's minute
_KEY_USED_SQL = (
    "UPDATE jobs_apikey SET last_used_at = now() WHERE key_hash = %s"
    " AND revoked_at IS NULL AND (last_used_at IS NULL OR last_used_at < now()"
    f" - interval '{int(API_KEY_LAST_USED_EVERY.total_seconds())} seconds')"
)

# an API key ``k`` by its hash (``%s``), live, of an active user ``u``
_KEY_FROM_SQL = "FROM jobs_apikey k JOIN auth_user u ON u.id = k.user_id"
_KEY_WHERE_SQL = "k.key_hash = %s AND k.revoked_at IS NULL AND u.is_active"

# the catalog rows the request path read last, by model id: the shape of
# ``job_open_by_key``'s statement, which checks them against the catalog
_catalog_hints: dict[str, CatalogModel] = {}


# the columns the request step's statement selects before the claim's
_OPEN_SELECT = (
    "(SELECT balance - reserved FROM credit)",
    "(SELECT rentals FROM credit)",
    "EXISTS (SELECT 1 FROM model)",
    "EXISTS (SELECT 1 FROM ok)",
)


@dataclass(frozen=True)
class _OpenText:
    """A request statement's text as ``_OpenStatement`` built it for one shape
    (``_open_shape``), the job's fields that are its parameters, in order, and
    how many parameters it takes."""

    sql: str
    job_fields: list
    param_count: int


# shape -> its statement's text (``_open_shape``), at most ``_OPEN_TEXTS_MAX``
_open_texts: dict[tuple, _OpenText] = {}
_OPEN_TEXTS_MAX = 1000


def _open_shape(request, model: CatalogModel, waiting_channel: str, renter_sql: str):
    """What the request step's statement text depends on beyond its parameters,
    or None when it is built afresh every time (a placement: its filters).

    A job field's SQL is a literal or a left-out column when its value is NULL,
    a boolean, 0, the empty string or a code constant (``ballast.db.sql_value``),
    and a parameter otherwise; of the job's values only these vary with the
    request: the endpoint, the messages or the prompt, stream, the model's price,
    the waiting channel. The rest of the text is fixed for a request without a
    placement (no rental, no target device, not a spot check).
    """
    if request.placement:
        return None
    return (
        renter_sql,
        model.id,
        model.price_completion_nano == 0,
        request.endpoint,
        request.messages is None,
        request.prompt is None,
        request.prompt == "",
        bool(request.stream),
        waiting_channel == "",
    )


class _OpenStatement:
    """PostgreSQL: the request step's statement and the reading of its row.

    One data-modifying statement: the renter (``renter_sql``: one row of
    ``user_id``, ``key_id``, or none), the catalog check (the model as read is
    still the catalog's), the credit (balance less open jobs' worst case, read
    after the caller's lock) and the gate ``ok`` (all three hold, no open
    rental, the credit covers ``max_tokens``); then the job's insert and the
    claim (``_ClaimStatement``), both only through ``ok``. ``statement`` is
    (sql, params, prepare) for ``ballast.db.transaction_one_message``; ``send``
    (or ``send_async``) runs it after the caller's lock, then the statements of
    ``also`` (the key's last use, for ``job_open_by_key``).
    """

    def __init__(
        self,
        *,
        request,
        model: CatalogModel,
        waiting_channel: str,
        renter_sql: str,
        renter_params: list,
        guess: GuessedPick | None = None,
    ) -> None:
        self.request, self.model, self.waiting_channel = request, model, waiting_channel
        self.also: list[tuple[str, list, bool]] = []  # sent after the statement
        self.now = now = timezone.now()
        self.job = job = job_build(
            renter=None, api_key=None, **_request_job(request, model, waiting_channel)
        )
        self.attempt = _attempt_build(job, "", now)
        # a request with a placement is never guessed (``_guess_take``)
        guess_ids = not request.placement
        shape = _open_shape(request, model, waiting_channel, renter_sql)
        text = _open_texts.get(shape) if shape is not None else None
        self.claim = _ClaimStatement(
            job=job,
            model=model,
            now=now,
            fcfs=True,
            attempt=self.attempt,
            gate="EXISTS (SELECT 1 FROM ok)",
            offered_when_claimed=True,
            guess=guess,
            guess_ids=guess_ids,
            build_sql=False,  # below, when the text is not kept
        )
        head_params = [
            *renter_params,
            model.id,
            model.context_length,
            model.vram_per_request_mb,
            model.price_completion_nano,
            *_credit_params(),
            Account.Kind.RENTER_CREDIT,
            request.params["max_tokens"] * model.price_completion_nano,
        ]
        if text is not None:
            self.statement = (text.sql, self._params_cached(text, head_params), True)
            self.claim.select_count = len(_OPEN_SELECT)
            return
        self.statement = (*self._sql_build(renter_sql, head_params), True)
        if shape is not None:
            if len(_open_texts) >= _OPEN_TEXTS_MAX:
                _open_texts.clear()
            _open_texts[shape] = _OpenText(
                sql=self.statement[0],
                job_fields=self._job_param_fields,
                param_count=len(self.statement[1]),
            )

    def _sql_build(self, renter_sql: str, head_params: list) -> tuple[str, list]:
        """(SQL, params) of the statement, built field by field (see the class
        docstring); notes which of the job's fields are parameters
        (``_job_param_fields``, for ``_OpenText``)."""
        job = self.job
        fields, values = row_values(job)  # sets created_at, which the FCFS count reads
        self.claim.sql_build()
        qn = db_connection().ops.quote_name
        from_renter = {
            "renter_id": "(SELECT user_id FROM renter)",
            "api_key_id": "(SELECT key_id FROM renter)",
        }
        job_columns, job_values, job_params = [], [], []
        self._job_param_fields = []
        for field, value in zip(fields, values, strict=True):
            if field.attname == "status":  # running when the claim took a slot
                running = sql_value(Job.Status.RUNNING, job_params)
                queued = sql_value(Job.Status.QUEUED, job_params)
                value_sql = (
                    f"CASE WHEN EXISTS (SELECT 1 FROM slot) THEN {running}"
                    f" ELSE {queued} END"
                )
            elif field.attname in from_renter:
                value_sql = from_renter[field.attname]
            else:
                value_sql = sql_value(value, job_params)
                if insert_leaves_out(field, value_sql):
                    continue
            if value_sql == "%s":
                self._job_param_fields.append(field)
            job_columns.append(qn(field.column))
            job_values.append(value_sql)
        credit = _credit_sql(
            "a.kind = %s AND a.user_id = (SELECT user_id FROM renter)",
            renter="(SELECT user_id FROM renter)",
        )
        return self.claim.sql(
            head=f"renter AS ({renter_sql}),"
            " model AS (SELECT 1 FROM jobs_catalogmodel WHERE id = %s AND active"
            " AND context_length = %s AND vram_per_request_mb = %s"
            " AND price_completion_nano = %s),"
            f" credit AS ({credit}),"
            " ok AS (SELECT 1 FROM credit, model WHERE NOT credit.rentals"
            " AND credit.balance - credit.reserved >= %s)",
            head_params=head_params,
            tail=f"job AS (INSERT INTO jobs_job ({', '.join(job_columns)})"
            f" SELECT {', '.join(job_values)} FROM ok)",
            tail_params=job_params,
            select=_OPEN_SELECT,
        )

    def _params_cached(self, text: _OpenText, head_params: list) -> list:
        """The params of a statement whose text was built before (``text``), in
        the order ``_sql_build`` gives them: the same values, each prepared as
        there, without building the text again (docs/performance.md, tenth
        round; ``tests/jobs/test_open_statement.py`` holds the two equal).
        Raises RuntimeError when their number is not the text's."""
        db = db_connection()
        # the job's own values first: ``pre_save`` sets created_at, as in row_values
        job_params = [
            field.get_db_prep_save(field.pre_save(self.job, True), db)
            for field in text.job_fields
        ]
        params = [*head_params, *self.claim.params_kept(), *job_params]
        if len(params) != text.param_count:
            raise RuntimeError(
                f"the request statement's cached text takes {text.param_count}"
                f" parameters, {len(params)} were made"
            )
        return params

    def send(self, lock_sql: str, lock_params: list) -> tuple[list, tuple]:
        """Run the transaction in one message (``ballast.db.transaction_one_message``):
        the async-commit setting, ``lock_sql`` (the renter's credit lock; its rows are
        returned, none when there is no account to lock), then the statement
        (its one row, returned). Sent once more when the database chose it as a
        deadlock's victim (``ballast.db.lock_conflict``): it was rolled back whole. (The
        request step locks the renter's credit account, then its device's model
        row; an answer's end takes them the other way round.)"""
        message = self._message(lock_sql, lock_params)
        try:
            _, locked, (row,), *_ = transaction_one_message(message)
        except DatabaseError as exc:
            if not lock_conflict(exc):
                raise
            _, locked, (row,), *_ = transaction_one_message(message)
        self.claim.attempt_settle(row)
        return locked, row

    async def send_async(self, lock_sql: str, lock_params: list) -> tuple[list, tuple]:
        """``send`` awaited in the event loop (``transaction_one_message_async``)."""
        message = self._message(lock_sql, lock_params)
        try:
            _, locked, (row,), *_ = await transaction_one_message_async(message)
        except DatabaseError as exc:
            if not lock_conflict(exc):
                raise
            _, locked, (row,), *_ = await transaction_one_message_async(message)
        self.claim.attempt_settle(row)
        return locked, row

    def _message(self, lock_sql: str, lock_params: list) -> list:
        return [
            (_ASYNC_COMMIT_SQL, [], False),
            (lock_sql, lock_params, True),
            self.statement,
            *self.also,
        ]

    def result_closing(self, row: tuple, **kwargs) -> Dispatch | None:
        """``result(row, **kwargs)``; when it raises after the job was stored, the
        job is closed first (``_job_close_stored``: failed, nothing billed)."""
        try:
            return self.result(row, **kwargs)
        except Exception:
            if self.stored(row):
                _job_close_stored(self.job)
            raise

    def stored(self, row: tuple) -> bool:
        """Whether the statement's row says the job was stored (``result`` then
        dispatches it, or raises)."""
        available, rentals_open, model_current, stored = row[:4]
        return bool(
            model_current and available is not None and not rentals_open and stored
        )

    def claimed_plainly(self, row: tuple) -> bool:
        """Whether ``result(row)`` will dispatch the slot the statement claimed,
        with no error and no database read: stored, current, claimed."""
        return self.stored(row) and self.claim.claimed(row)

    def result_reads(self, row: tuple) -> bool:
        """Whether ``result(row)`` goes to the database: a job stored without a
        slot claimed (the wait or 503 look-ups of ``_dispatch_unclaimed``)."""
        return self.stored(row) and not self.claim.claimed(row)

    def result(
        self, row: tuple, *, renter, api_key: ApiKey, spot_check_due: bool | None = None
    ) -> Dispatch | None:
        """The dispatch of the stored job (``self.job``, its renter and key set),
        or None when nothing was stored for the caller to retry the slow way (the
        catalog changed, an open rental). ``spot_check_due``: as
        ``_dispatch_claimed``. Raises ApiError 402."""
        available, rentals_open, model_current, stored = row[:4]
        if not model_current:
            _catalog_hints.pop(self.model.id, None)
            return None
        if available is None or rentals_open:
            return None
        if not stored:
            raise _credit_refused(available, self.request, self.model)
        job = self.job
        job.renter, job.api_key = renter, api_key
        row_saved(job)
        ahead, device = self.claim.result(row)
        if device is None:
            return _dispatch_unclaimed(
                job=job,
                model=self.model,
                now=self.now,
                ahead=ahead,
                waiting_channel=self.waiting_channel,
            )
        job.status = Job.Status.RUNNING
        return _dispatch_claimed(
            job=job,
            attempt=self.attempt,
            device=device,
            continue_from="",
            now=self.now,
            spot_check_due=spot_check_due,
        )


def job_submit(
    *, api_key: ApiKey, request, waiting_channel: str = "", model=UNREAD
) -> tuple[Job, CatalogModel]:
    """Store a renter's checked request (``jobs.requests.CompletionRequest``) as a
    job, inside the caller's transaction (``job_open``); return the job and model.

    Raises ApiError 404 for a model not in the catalog, 400 when the prompt and
    ``max_tokens`` do not fit the model's context, and 402 when the renter's
    balance, less the worst case of their jobs still running, cannot cover
    ``max_tokens`` at the model's price (the renter's credit account is locked
    until the transaction ends, so parallel requests cannot overspend).
    """
    from .errors import ApiError

    model = _request_model(request, model)
    rental = None
    if request.placement.get("rental"):
        rental = Rental.objects.filter(
            id=_uuid_or_none(request.placement["rental"]), renter=api_key.user
        ).first()
        if rental is None:
            raise ApiError(
                404,
                f"rental '{request.placement['rental']}' not found",
                "rental_not_found",
                "placement.rental",
            )
        if rental.status != Rental.Status.LIVE:
            raise ApiError(
                409,
                f"rental '{rental.id}' is {rental.status}, not live",
                "rental_not_live",
                "placement.rental",
            )
    _request_fits(model, request)
    worst_case = request.params["max_tokens"] * model.price_completion_nano
    account_id = credit_lock(renter=api_key.user)
    balance = credit_available_nano(renter=api_key.user, account_id=account_id)
    if balance < worst_case:
        raise _credit_refused(balance, request, model)
    job = job_create(
        renter=api_key.user,
        api_key=api_key,
        rental=rental,
        **_request_job(request, model, waiting_channel),
    )
    return job, model


def _request_job(request, model: CatalogModel, waiting_channel: str) -> dict:
    """``job_build``'s arguments that come from a renter's checked request."""
    return dict(
        model=model,
        endpoint=request.endpoint,
        messages=request.messages,
        prompt=request.prompt,
        params=request.params,
        placement=request.placement,
        stream=request.stream,
        waiting_channel=waiting_channel,
    )


def _request_model(request, model=UNREAD) -> CatalogModel:
    """The active catalog model the request names (``model`` when the caller read
    it already); ApiError 404 when there is none."""
    from .errors import ApiError

    if model is UNREAD:
        model = catalog_model_active(model_id=request.model)
    if model is None:
        raise ApiError(
            404,
            f"model '{request.model}' is not in the catalog",
            "model_not_found",
            "model",
        )
    return model


def _request_fits_cheaply(model: CatalogModel, request) -> bool:
    """Whether the prompt's cheap bound (``tokens.prompt_tokens_most``: its bytes)
    plus ``max_tokens`` fits the model's context; False when only the tokenizer
    can tell (``_request_fits``)."""
    room = model.context_length - request.params["max_tokens"]
    most = prompt_tokens_most(model.id, request.messages, request.prompt)
    return most is not None and most <= room


def _request_fits(model: CatalogModel, request) -> None:
    """ApiError 400 when the prompt (counted as the host's engine counts it:
    ``tokens.prompt_token_count``) plus ``max_tokens`` exceed the model's context.

    A prompt whose cheap bound (``tokens.prompt_tokens_most``: its bytes) fits is
    not rendered or tokenized (the request path).
    """
    from .errors import ApiError

    if _request_fits_cheaply(model, request):
        return
    room = model.context_length - request.params["max_tokens"]
    least = prompt_tokens_least(model.id, request.messages, request.prompt)
    if least is not None and least > room:  # refused without rendering it
        count, unit = (
            (len(request.messages), "message")
            if request.messages is not None
            else (len(request.prompt or ""), "character")
        )
        what = f"{count} {unit}{'' if count == 1 else 's'}"
        raise ApiError(
            400,
            f"the prompt (at least {least} tokens: {what}) plus "
            f"max_tokens={request.params['max_tokens']} exceed the "
            f"model's context of {model.context_length} tokens",
            "context_length_exceeded",
            "messages" if request.messages is not None else "prompt",
        )
    prompt_tokens = prompt_token_count(model.id, request.messages, request.prompt)
    if prompt_tokens is not None and prompt_tokens > room:
        raise ApiError(
            400,
            f"the prompt ({prompt_tokens} tokens) plus max_tokens="
            f"{request.params['max_tokens']} exceed the model's context of "
            f"{model.context_length} tokens",
            "context_length_exceeded",
            "messages" if request.messages is not None else "prompt",
        )


def _credit_refused(available: int, request, model: CatalogModel):
    """The ApiError 402 of a request whose worst case ``available`` nano-USD
    (balance less reservations) cannot cover."""
    from billing.money import nano_to_usd_str

    from .errors import ApiError

    return ApiError(
        402,
        f"available credit {nano_to_usd_str(available)} USD (the balance less the "
        "worst case of your open jobs) cannot cover max_tokens="
        f"{request.params['max_tokens']} at {nano_to_usd_str(model.price_completion_nano)} "
        "USD per token",
        "insufficient_credit",
    )


def catalog_model_active(*, model_id: str) -> CatalogModel | None:
    """The active catalog model ``model_id``, or None (one fixed statement)."""
    row = row_fetch(
        f"SELECT {', '.join(_CATALOG_FIELDS)} FROM jobs_catalogmodel"
        " WHERE id = %s AND active",
        [model_id],
    )
    return CatalogModel.from_db(connection.alias, _CATALOG_FIELDS, row) if row else None


def _uuid_or_none(value: str):
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None
