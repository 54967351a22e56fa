"""Writes for machines and devices: registration, hello, heartbeats, outcomes.

Every function is a transaction; consumers call them through
``database_sync_to_async``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import Aggregate, F, FloatField
from django.utils import timezone

from ballast.db import (
    db_datetime,
    row_fetch,
    rows_changed,
    rows_fetch,
    value_datetime,
    value_uuid,
)

from .models import (
    Benchmark,
    CoordinatorLease,
    Device,
    DeviceModel,
    DeviceOutcome,
    FailedCapability,
    Machine,
    OnlineSpan,
    token_hash,
    token_new,
)
from .scoring import (
    WINDOW,
    quarantine_after_failure,
    quarantine_release,
    score_round,
    score_unrounded,
)

RETURN_AFTER = timedelta(minutes=10)


class KeyMismatch(Exception):
    """The ``hello`` announced a public key other than the one pinned for the machine."""


@dataclass(frozen=True)
class HeartbeatResult:
    """What a heartbeat changed: models that gained capacity, and how many slots."""

    models_with_capacity: frozenset[str]
    slots_gained: int = 0


def user_get_or_create(*, email: str) -> AbstractBaseUser:
    """Return the user with this email (username = email), creating it if needed."""
    User = get_user_model()
    user, _ = User.objects.get_or_create(username=email, defaults={"email": email})
    return user


@transaction.atomic
def machine_register(
    *, owner: AbstractBaseUser, name: str, region: str = ""
) -> tuple[Machine, str]:
    """Register a machine for ``owner``; return it and its plain token (shown once).

    The token is stored hashed (sha256). Raises ValueError on an empty name.
    """
    if not name.strip():
        raise ValueError("machine name must not be empty")
    token = token_new("bm")
    machine = Machine.objects.create(
        owner=owner,
        name=name.strip(),
        region=region.strip().lower(),
        token_hash=token_hash(token),
        token_prefix=token[:10],
    )
    return machine, token


@transaction.atomic
def machine_create(
    *, owner_email: str, name: str, region: str = ""
) -> tuple[Machine, str]:
    """Register a machine for the owner with this email (created if new).

    Returns the machine and its plain token. Raises ValueError on an empty name.
    """
    return machine_register(
        owner=user_get_or_create(email=owner_email), name=name, region=region
    )


def machine_authenticate(*, token: str) -> Machine | None:
    """Return the machine whose token this is, or None."""
    if not token:
        return None
    return Machine.objects.filter(token_hash=token_hash(token)).first()


@transaction.atomic
def machine_hello(
    *,
    machine_id: str,
    channel_name: str,
    hello: dict,
    now: datetime | None = None,
    lease_id=None,
) -> str:
    """Record a ``hello``: pin or check the key, store the build, upsert devices.

    Marks the machine connected on ``channel_name``, vouched for by the process
    lease ``lease_id`` (None: by its recorded heartbeats only) and ``stale`` until
    its first heartbeat (``hosts.liveness``). Closes the online span of a previous
    connection still counted online (a process that died: at its lease's end).
    Returns the channel of the connection it replaces ('' if none), which the
    caller closes. Raises KeyMismatch when a key is already pinned and differs
    (DESIGN.md: refused until the owner resets it).
    """
    now = now or timezone.now()
    machine = Machine.objects.select_for_update().get(id=machine_id)
    if machine.public_key and machine.public_key != hello["public_key"]:
        raise KeyMismatch(
            "this machine's key differs from the pinned one; the owner must reset it"
        )
    seen = machine.seen_until()
    came_back = seen is not None and now - seen > RETURN_AFTER
    if machine.connected and not machine.stale and seen is not None:
        online_span_close(machine_id=machine_id, at=min(seen, now))
    previous_channel = machine.channel_name if machine.connected else ""
    machine.public_key = hello["public_key"]
    machine.agent_version = hello["agent_version"]
    machine.engine_name = hello["engine_name"]
    machine.engine_version = hello["engine_version"]
    machine.agent_accepts_serverless = hello["accepts_serverless"]
    machine.connected = True
    machine.channel_name = channel_name
    machine.connected_at = now
    machine.lease_id = lease_id
    machine.stale = True
    machine.save()
    for dev in hello["devices"]:
        device, _ = Device.objects.update_or_create(
            machine=machine,
            index=dev["index"],
            defaults={"name": dev["name"], "vram_total_mb": dev["vram_total_mb"]},
        )
        if came_back:
            spot_check_mark_due(device_id=device.id, reason="return", now=now)
    return previous_channel


def spot_check_mark_due(
    *, device_id: int, reason: str, now: datetime | None = None
) -> bool:
    """Mark a spot check due on the device after a random delay (0–60 s).

    The delay keeps its timing from telling the host anything. A check already due
    is kept (the earlier one wins). Returns True when this call marked it.
    """
    if not settings.BALLAST_SPOT_CHECKS:
        return False
    import random

    now = now or timezone.now()
    due = now + timedelta(
        seconds=random.uniform(0, settings.BALLAST_SPOT_CHECK_MAX_DELAY_S)
    )
    return bool(
        Device.objects.filter(id=device_id, spot_check_due_at__isnull=True).update(
            spot_check_due_at=due, spot_check_reason=reason
        )
    )


TEMP_STEP_C = 2.0
VRAM_STEP_MB = 256
TELEMETRY_REFRESH = timedelta(seconds=60)
TELEMETRY_REFRESH_BEATS = 50


def telemetry_refresh() -> timedelta:
    """How long unchanged telemetry may go unwritten: 60 s, or 50 heartbeat intervals
    if longer. A refresh writes the device and its device-model rows (2 statements),
    so a steady machine costs ≤ 2/50 = 0.04 writes per heartbeat (issue 8: ≤ 0.05
    with the lease's share; 25 intervals gave 0.067 over a 60 s window at 2 s).
    Eligibility never waits for it: a change it can see is written at once."""
    return max(
        TELEMETRY_REFRESH,
        timedelta(
            seconds=TELEMETRY_REFRESH_BEATS * settings.BALLAST_HEARTBEAT_INTERVAL_S
        ),
    )


@dataclass
class HeartbeatMemo:
    """A connection's heartbeats in memory (``hosts.liveness``).

    ``last_beat_at`` is the time the last heartbeat was received; ``stale`` is True
    until a liveness write un-marks the machine (and again once the lease loop marks
    it stale); ``recorded_at`` is the last liveness write. ``devices`` maps a device
    index to the last written (temp °C, free VRAM MiB, slots, loaded models) and
    ``written_at`` to when.
    """

    recorded_at: datetime | None = None
    paused: bool | None = None
    last_beat_at: datetime | None = None
    stale: bool = True
    devices: dict[int, tuple] = field(default_factory=dict)
    written_at: dict[int, datetime] = field(default_factory=dict)


def _crosses(old: float | None, new: float | None, thresholds) -> bool:
    if old is None or new is None:
        return old != new
    return any((old < t) != (new < t) for t in thresholds)


def heartbeat_changes(
    *, memo: HeartbeatMemo, heartbeat: dict, now: datetime, vram_needs_mb=()
) -> tuple[bool, list[dict]]:
    """Decide what of a heartbeat must reach the database: (liveness, device reports).

    Liveness is written when the machine is marked stale (the first heartbeat of a
    connection, or the first after the lease loop's stale mark) or the pause flag
    changed; a steady heartbeat writes none (the process lease vouches for it,
    ``hosts.liveness``). A device's report is
    written when its slots or models change, its temperature moves ≥ 2 °C or crosses
    ``BALLAST_MAX_GPU_TEMP_C``, its free VRAM moves ≥ 256 MiB or crosses a catalog
    model's need, or it was last written longer than ``telemetry_refresh()`` ago.
    Pure: touches nothing.
    """
    liveness = memo.stale or memo.paused != heartbeat["paused"]
    changed = []
    refresh = telemetry_refresh()
    for report in heartbeat["devices"]:
        last = memo.devices.get(report["index"])
        written = memo.written_at.get(report["index"])
        temp, vram, slots, models_ = (
            report["temp_c"],
            report["vram_free_mb"],
            report["slots"],
            tuple(report["loaded_models"]),
        )
        if (
            last is None
            or written is None
            or now - written >= refresh
            or (slots, models_) != (last[2], last[3])
            or _crosses(last[0], temp, (settings.BALLAST_MAX_GPU_TEMP_C,))
            or (
                temp is not None
                and last[0] is not None
                and abs(temp - last[0]) >= TEMP_STEP_C
            )
            or _crosses(last[1], vram, vram_needs_mb)
            or abs(vram - last[1]) >= VRAM_STEP_MB
        ):
            changed.append(report)
    return liveness, changed


def heartbeat_memo_update(
    memo: HeartbeatMemo,
    *,
    liveness: bool,
    paused: bool,
    reports: list[dict],
    now: datetime,
) -> None:
    """Record in ``memo`` what was just written (liveness un-marks ``stale``)."""
    if liveness:
        memo.recorded_at = now
        memo.paused = paused
        memo.stale = False
    for report in reports:
        memo.devices[report["index"]] = (
            report["temp_c"],
            report["vram_free_mb"],
            report["slots"],
            tuple(report["loaded_models"]),
        )
        memo.written_at[report["index"]] = now


@transaction.atomic
def machine_heartbeat(
    *,
    machine_id: str,
    heartbeat: dict,
    now: datetime | None = None,
    liveness: bool = True,
    channel_name: str | None = None,
) -> HeartbeatResult:
    """Store a heartbeat: liveness (last heartbeat, un-mark stale, online span) and
    device reports.

    ``now`` must be when the heartbeat was received (the recorded time never runs
    ahead of the real one). With ``channel_name``, liveness is written only while
    that is still the machine's connection. ``heartbeat["devices"]`` holds the
    reports to write (all of them, or those ``heartbeat_changes`` picked); a
    loaded model that is not in the catalog is ignored (no row: a host cannot
    grow the table with made-up ids). Returns the models that gained capacity
    (newly loaded or more slots), so the caller can wake requests waiting for
    them.
    """
    now = now or timezone.now()
    if liveness:
        machines = Machine.objects.filter(id=machine_id)
        if channel_name is not None:
            machines = machines.filter(channel_name=channel_name)
        if machines.update(
            last_heartbeat_at=now, host_paused=heartbeat["paused"], stale=False
        ):
            online_span_extend(machine_id=machine_id, now=now)
    gained: set[str] = set()
    slots_gained = 0
    if not heartbeat["devices"]:
        return HeartbeatResult(models_with_capacity=frozenset())
    devices = {d.index: d for d in Device.objects.filter(machine_id=machine_id)}
    for report in heartbeat["devices"]:
        device = devices.get(report["index"])
        if device is None:
            continue  # a device not announced in hello: ignored
        loaded_now = set(report["loaded_models"])
        existing = {dm.model_id: dm for dm in DeviceModel.objects.filter(device=device)}
        unknown = loaded_now - existing.keys()
        if unknown:  # rows only for the catalog's models (a host's list is bounded)
            loaded_now -= unknown - _catalog_ids(unknown)
        if report["slots"] > device.slots_total:
            gained |= loaded_now
            slots_gained += report["slots"] - device.slots_total
        Device.objects.filter(id=device.id).update(
            temp_c=report["temp_c"],
            vram_free_mb=report["vram_free_mb"],
            slots_total=report["slots"],
        )
        for model_id in loaded_now:
            dm = existing.get(model_id)
            if dm is None:
                DeviceModel.objects.create(
                    device=device, model_id=model_id, loaded=True, first_loaded_at=now
                )
                spot_check_mark_due(device_id=device.id, reason="first_load", now=now)
            elif not dm.loaded:
                DeviceModel.objects.filter(id=dm.id).update(loaded=True)
            else:
                continue
            gained.add(model_id)
            slots_gained += report["slots"]
        stale = [
            dm.id for mid, dm in existing.items() if dm.loaded and mid not in loaded_now
        ]
        if stale:
            DeviceModel.objects.filter(id__in=stale).update(loaded=False)
    return HeartbeatResult(
        models_with_capacity=frozenset(gained), slots_gained=slots_gained
    )


def _catalog_ids(model_ids: set[str]) -> set[str]:
    """Those of ``model_ids`` that are catalog models (active or not)."""
    from jobs.models import CatalogModel

    return set(
        CatalogModel.objects.filter(id__in=model_ids).values_list("id", flat=True)
    )


@transaction.atomic
def machine_disconnect(
    *, machine_id: str, channel_name: str, last_heartbeat_at: datetime | None = None
) -> bool:
    """Mark the machine offline if ``channel_name`` is still its connection.

    A compare-and-set, so an old connection closing never hides a newer one.
    ``last_heartbeat_at`` (the connection's last heartbeat, kept in memory) is
    recorded and ends the online span. Returns True when this call took the
    machine offline.
    """
    was_stale = (
        Machine.objects.select_for_update()
        .filter(id=machine_id, channel_name=channel_name)
        .values_list("stale", flat=True)
        .first()
    )
    if was_stale is None:
        return False
    fields = {"connected": False, "channel_name": "", "stale": True}
    if last_heartbeat_at is not None:
        fields["last_heartbeat_at"] = last_heartbeat_at
    Machine.objects.filter(id=machine_id, channel_name=channel_name).update(**fields)
    if not was_stale and last_heartbeat_at is not None:
        online_span_close(machine_id=machine_id, at=last_heartbeat_at)
    return True


@transaction.atomic
def machines_stale_mark(*, marks: list[tuple[str, str, datetime]]) -> int:
    """Mark machines stale: ``marks`` = [(machine id, channel name, last heartbeat)].

    Called by the lease loop (``hosts.liveness``) before it renews its lease. Each
    is a compare-and-set on the connection (a newer connection is untouched);
    records the exact last heartbeat and ends the online span there. Returns how
    many machines were marked.
    """
    marked = 0
    for machine_id, channel_name, last_beat_at in marks:
        if Machine.objects.filter(
            id=machine_id, channel_name=channel_name, stale=False
        ).update(stale=True, last_heartbeat_at=last_beat_at):
            online_span_close(machine_id=machine_id, at=last_beat_at)
            marked += 1
    return marked


LEASES_KEPT = timedelta(days=1)


def lease_renew(*, lease_id, name: str, until: datetime) -> None:
    """Set the process lease's ``lease_until`` (created if missing: a new process).

    On creation, prunes the leases that lapsed over a day ago and vouch for no
    machine (one row per process start would otherwise pile up).
    """
    if CoordinatorLease.objects.filter(id=lease_id).update(lease_until=until):
        return
    CoordinatorLease.objects.create(id=lease_id, name=name, lease_until=until)
    CoordinatorLease.objects.filter(
        lease_until__lt=timezone.now() - LEASES_KEPT, machines__isnull=True
    ).delete()


def machines_spot_check_due(*, lease_id, now: datetime) -> list[str]:
    """Ids (str) of machines connected under this lease with a spot check due by ``now``."""
    return [
        str(mid)
        for mid in Device.objects.filter(
            machine__lease_id=lease_id,
            machine__connected=True,
            spot_check_due_at__lte=now,
        )
        .values_list("machine_id", flat=True)
        .distinct()
    ]


@transaction.atomic
def capability_failed_record(*, machine_id: str, report: dict) -> FailedCapability:
    """Record a ``model_load_failed`` for the machine's current build.

    Keeps the engine's error text, counts repeats; the model is marked not loaded on
    that device so it is not offered there.
    """
    machine = Machine.objects.get(id=machine_id)
    capability, created = FailedCapability.objects.get_or_create(
        machine=machine,
        device_index=report["device"],
        model_id=report["model"],
        build=machine.build,
        defaults={"error": report["error"]},
    )
    if not created:
        FailedCapability.objects.filter(id=capability.id).update(
            count=F("count") + 1, error=report["error"], last_at=timezone.now()
        )
    DeviceModel.objects.filter(
        device__machine=machine,
        device__index=report["device"],
        model_id=report["model"],
    ).update(loaded=False)
    return capability


BENCHMARKS_KEPT = 20  # per device and model: a host cannot grow its page without end


def benchmark_record(*, machine_id: str, report: dict) -> Benchmark | None:
    """Store a benchmark measured on the machine's own hardware; None for an unknown device."""
    device = Device.objects.filter(
        machine_id=machine_id, index=report["device"]
    ).first()
    if device is None:
        return None
    benchmark = Benchmark.objects.create(
        device=device,
        model_id=report["model"],
        tokens_per_s=report["tokens_per_s"],
        ttft_ms=report["ttft_ms"],
        vram_used_mb=report["vram_used_mb"],
    )
    keep = Benchmark.objects.filter(device=device, model_id=report["model"]).values(
        "id"
    )[:BENCHMARKS_KEPT]
    Benchmark.objects.filter(device=device, model_id=report["model"]).exclude(
        id__in=list(keep.values_list("id", flat=True))
    ).delete()
    return benchmark


def online_span_extend(*, machine_id: str, now: datetime) -> None:
    """Extend the machine's latest online span to ``now``, or open a new one.

    Called when a machine becomes live (its first heartbeat, or the first after a
    stale mark); the span is ended by ``online_span_close`` (stale, disconnect, or
    the next ``hello`` after its process's lease lapsed), and a live machine's
    latest span counts until now. A gap longer than ``BALLAST_HEARTBEAT_MAX_AGE_S``
    since the span's end starts a new span, so offline time never counts as online.
    """
    gap = timedelta(seconds=settings.BALLAST_HEARTBEAT_MAX_AGE_S)
    extended = OnlineSpan.objects.filter(
        id__in=OnlineSpan.objects.filter(machine_id=machine_id, ended_at__gte=now - gap)
        .order_by("-ended_at")
        .values("id")[:1]
    ).update(ended_at=now)
    if not extended:
        OnlineSpan.objects.create(machine_id=machine_id, started_at=now, ended_at=now)


def online_span_close(*, machine_id: str, at: datetime) -> None:
    """End the machine's latest online span at ``at`` (never earlier than it ends)."""
    OnlineSpan.objects.filter(
        id__in=OnlineSpan.objects.filter(machine_id=machine_id)
        .order_by("-ended_at")
        .values("id")[:1],
        ended_at__lt=at,
    ).update(ended_at=at)


def device_online_fraction(*, device: Device, now: datetime) -> Decimal:
    """Fraction (0..1) of the last 24 h — or of the time since the device was first
    seen, if shorter — that its machine was online (heartbeat gaps ≤ 30 s)."""
    start = max(now - timedelta(hours=24), device.first_seen_at)
    spans = [
        (s.id, s.started_at, s.ended_at)
        for s in OnlineSpan.objects.filter(
            machine_id=device.machine_id, ended_at__gt=start
        )
    ]
    latest = OnlineSpan.objects.filter(machine_id=device.machine_id).first()
    return online_fraction(
        machine=device.machine,
        start=start,
        spans=spans,
        latest=(latest.id, latest.started_at, latest.ended_at) if latest else None,
        now=now,
    )


def online_fraction(
    *,
    machine: Machine,
    start: datetime,
    spans: list[tuple],
    latest: tuple | None,
    now: datetime,
) -> Decimal:
    """The online part of the score from the machine's spans (pure; DESIGN.md
    "Reliability score": the fraction of [``start``, ``now``] it was online).

    ``spans`` are (id, started_at, ended_at) of the machine's spans ended after
    ``start``, newest first; ``latest`` is its newest span whatever its end (or
    None). ``machine`` gives liveness (``is_online``, ``seen_until``: reads
    ``machine.lease``). Returns 0..1 rounded to 6 places.
    """
    total = (now - start).total_seconds()
    if total <= 0:
        return Decimal(1)
    online = 0.0
    live = machine.is_online(now)
    # a connected machine not marked stale whose lease lapsed: online until then
    vouched = machine.connected and not machine.stale
    seen = machine.seen_until() if vouched and not live else None
    spans = list(spans)
    # the latest span stays open (ended at its start) while the machine is live
    if latest is not None and (not spans or spans[0][0] != latest[0]):
        spans.insert(0, latest)
    for i, (_, started_at, ended_at) in enumerate(spans):  # newest first
        # the current span of a machine still online lasts until now
        if i == 0 and live:
            end = now
        elif i == 0 and seen is not None:
            end = min(max(ended_at, seen), now)
        else:
            end = min(ended_at, now)
        online += max(0.0, (end - max(started_at, start)).total_seconds())
    return min(Decimal(1), Decimal(str(round(online / total, 6))))


MODEL_MEDIAN_TTL_S = 30.0
_model_medians: dict[str, tuple[float, float | None]] = {}


def model_ttft_median(*, model_id: str, now: datetime) -> float | None:
    """The model's median time to first token (ms) over all devices, last hour.

    Cached per process for 30 s: it moves slowly, and computing it scans every
    outcome of the hour, which must not happen on every request.
    """
    import time

    cached = _model_medians.get(model_id)
    if cached and time.monotonic() - cached[0] < MODEL_MEDIAN_TTL_S:
        return cached[1]
    median = _hour_ttft_median(now, model_id=model_id)
    _model_medians[model_id] = (time.monotonic(), median)
    return median


def device_ttft_median(*, device_id: int, model_id: str, now: datetime) -> float | None:
    """This device's median time to first token (ms) for the model, last hour."""
    return _hour_ttft_median(now, device_id=device_id, model_id=model_id)


class _Median(Aggregate):
    """PostgreSQL's median of a column, as ``statistics.median`` takes it (the
    mean of the two middle values when their number is even); NULL for none."""

    function = "percentile_cont"
    template = "%(function)s(0.5) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()


def _hour_ttft_median(now: datetime, **where) -> float | None:
    """The median first-token time (ms) of the successful outcomes of the hour
    before ``now`` that match ``where`` (field lookups), None when there are
    none: computed by PostgreSQL (``_Median``: the hour's values are not sent),
    elsewhere (SQLite) ``statistics.median`` of them."""
    outcomes = DeviceOutcome.objects.filter(
        success=True,
        ttft_ms__isnull=False,
        created_at__gte=now - timedelta(hours=1),
        **where,
    )
    if connection.vendor == "postgresql":
        return outcomes.aggregate(median=_Median("ttft_ms"))["median"]
    values = list(outcomes.values_list("ttft_ms", flat=True))
    return statistics.median(values) if values else None


def device_ttft_medians(
    *, device: Device, model_id: str, now: datetime
) -> tuple[float | None, float | None]:
    """Return (model median ttft ms over all devices, this device's median), last hour."""
    return (
        model_ttft_median(model_id=model_id, now=now),
        device_ttft_median(device_id=device.id, model_id=model_id, now=now),
    )


@transaction.atomic(savepoint=False)  # usually inside an attempt's end
def device_outcome_record(
    *,
    device_id: int,
    success: bool,
    source: str = DeviceOutcome.Source.ATTEMPT,
    reason: str = "",
    model_id: str = "",
    ttft_ms: int | None = None,
    now: datetime | None = None,
    slot_free: bool = False,
) -> int:
    """Record one outcome for the device and recompute its score; return the score.

    DESIGN.md "Reliability score": the score is recomputed on every outcome, in
    the caller's transaction (the end of a job records it with the charge). With
    ``model_id`` and a ``ttft_ms`` (ms, a success's first token), the device's
    median first-token time for the model (last hour) is stored on its
    device-model row. ``slot_free``: also give back one of the device's slots
    (the ended attempt's) in the same write as the score. A failure is judged
    for quarantine at once (``device_quarantine_judge``). A renter's cancel is
    never passed here. Fixed statements (``ballast.db``): an insert, two reads,
    the device write and, when the median moved, the device-model write.
    Raises Device.DoesNotExist for an unknown device.
    """
    now = now or timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO hosts_deviceoutcome"
            " (device_id, source, success, reason, model_id, ttft_ms, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [
                device_id,
                source,
                success,
                reason,
                model_id,
                ttft_ms,
                db_datetime(timezone.now()),  # auto_now_add: the real time
            ],
        )
    inputs = _score_inputs(device_id=device_id, model_id=model_id, now=now)
    # the device row before its device-model rows, the order of the claim (which
    # locks the device, then moves the row's tie-break key): no lock cycle
    score = _score_write(device_id=device_id, inputs=inputs, slot_free=slot_free)
    if model_id and ttft_ms is not None:
        median = inputs.device_median
        recent = round(median) if median is not None else None
        if recent != inputs.ttft_ms_recent:  # unchanged: nothing to write
            rows_changed(
                "UPDATE hosts_devicemodel SET ttft_ms_recent = %s"
                " WHERE device_id = %s AND model_id = %s",
                [recent, device_id, model_id],
            )
    if not success:
        device_quarantine_judge(device_id=device_id, score=score, now=now)
    return score


def spot_checks_recent(*, device_id: int) -> list[bool]:
    """The device's last 20 judged spot checks, newest first (True = passed)."""
    return list(
        DeviceOutcome.objects.filter(
            device_id=device_id, source=DeviceOutcome.Source.SPOT_CHECK
        ).values_list("success", flat=True)[:20]
    )


def device_quarantine_judge(
    *, device_id: int, score: int, now: datetime | None = None
) -> bool:
    """Quarantine the device if a just-recorded failure calls for it; True if it did.

    DESIGN.md "Spot checks": score under 50 or 3 failed spot checks among the last
    20. A quarantined device gets only spot checks, one marked due now.
    """
    now = now or timezone.now()
    if not quarantine_after_failure(
        score=score, recent_checks=spot_checks_recent(device_id=device_id)
    ):
        return False
    newly = Device.objects.filter(id=device_id, quarantined=False).update(
        quarantined=True, quarantined_at=now
    )
    if newly:
        spot_check_mark_due(device_id=device_id, reason="quarantine", now=now)
    return bool(newly)


def device_quarantine_release_judge(*, device_id: int) -> bool:
    """Release a quarantined device after 3 passed spot checks in a row; True if released."""
    if not quarantine_release(recent_checks=spot_checks_recent(device_id=device_id)):
        return False
    return bool(
        Device.objects.filter(id=device_id, quarantined=True).update(
            quarantined=False, quarantined_at=None
        )
    )


def device_score_recompute(
    *,
    device_id: int,
    now: datetime | None = None,
    model_id: str = "",
    device_median: float | None = None,
) -> int:
    """Recompute and store the device's score from its last 50 outcomes; return it.

    DESIGN.md "Reliability score" (also run periodically for the uptime part).
    Without ``model_id`` the latency part uses the model the device served last.
    ``device_median`` (ms), when the caller just computed it, replaces the
    device's own median. Raises Device.DoesNotExist for an unknown device.
    """
    now = now or timezone.now()
    inputs = _score_inputs(device_id=device_id, model_id=model_id, now=now)
    if device_median is not None:
        inputs.device_median = device_median
    return _score_write(device_id=device_id, inputs=inputs)


@dataclass
class ScoreInputs:
    """What a device's score is computed from (DESIGN.md "Reliability score").

    ``outcomes``/``successes``: counts in its last 50 outcomes; ``online``: the
    online fraction 0..1; ``model_median``/``device_median``: first-token medians
    (ms, last hour; None when unknown); ``ttft_ms_recent``: the value stored on its
    device-model row for ``model_id`` (None when unknown or no row).
    """

    outcomes: int
    successes: int
    online: Decimal
    model_median: float | None
    device_median: float | None
    ttft_ms_recent: int | None

    @property
    def score(self) -> int:
        return score_round(
            score_unrounded(
                outcomes=self.outcomes,
                successes=self.successes,
                online_fraction=self.online,
                model_median_ttft_ms=self.model_median,
                device_ttft_ms=self.device_median,
            )
        )


_LAST_OUTCOMES = (
    "SELECT success FROM hosts_deviceoutcome WHERE device_id = %s"
    f" ORDER BY created_at DESC, id DESC LIMIT {WINDOW}"
)
_SCORE_DEVICE_SQL = (
    "SELECT d.first_seen_at, d.machine_id, m.connected, m.stale,"
    " m.last_heartbeat_at, m.lease_id, l.lease_until,"
    f" (SELECT COUNT(*) FROM ({_LAST_OUTCOMES}) w),"
    f" (SELECT COUNT(*) FROM ({_LAST_OUTCOMES}) w WHERE w.success),"
    " (SELECT o.model_id FROM hosts_deviceoutcome o"
    "  WHERE o.device_id = %s AND o.model_id <> ''"
    "  ORDER BY o.created_at DESC, o.id DESC LIMIT 1)"
    " FROM hosts_device d JOIN hosts_machine m ON m.id = d.machine_id"
    " LEFT JOIN hosts_coordinatorlease l ON l.id = m.lease_id"
    " WHERE d.id = %s"
)
_SCORE_SERIES_SQL = (
    # 0: spans ended after the start; 1: the newest span; 2: this hour's
    # first-token times of the device for the model; 3: its device-model row
    "SELECT 0, id, started_at, ended_at, CAST(NULL AS INTEGER)"
    " FROM hosts_onlinespan WHERE machine_id = %s AND ended_at > %s"
    " UNION ALL SELECT 1, id, started_at, ended_at, CAST(NULL AS INTEGER) FROM"
    " (SELECT id, started_at, ended_at FROM hosts_onlinespan WHERE machine_id = %s"
    "  ORDER BY ended_at DESC LIMIT 1) newest"
    " UNION ALL SELECT 2, NULL, NULL, NULL, {ttfts} FROM hosts_deviceoutcome"
    " WHERE device_id = %s AND model_id = %s AND success AND ttft_ms IS NOT NULL"
    " AND created_at >= %s"
    " UNION ALL SELECT 3, id, NULL, NULL, ttft_ms_recent FROM hosts_devicemodel"
    " WHERE device_id = %s AND model_id = %s"
    " ORDER BY 1, 4 DESC"
)
# PostgreSQL: the median of the hour's first-token times (``_Median``: one row,
# NULL when none); SQLite, which has no such aggregate: every value
_MEDIAN_SQL = _Median.template % {
    "function": _Median.function,
    "expressions": "ttft_ms",
}


def _score_series_sql() -> str:
    """``_SCORE_SERIES_SQL`` for this connection's database (see ``_MEDIAN_SQL``)."""
    postgresql = connection.vendor == "postgresql"
    return _SCORE_SERIES_SQL.format(ttfts=_MEDIAN_SQL if postgresql else "ttft_ms")


def _score_inputs(*, device_id: int, model_id: str, now: datetime) -> ScoreInputs:
    """Read a device's score inputs in two fixed statements (``ScoreInputs``).

    The same rules as ``device_online_fraction``, ``device_ttft_median`` and
    ``model_ttft_median`` (cached per process); without ``model_id``, the model of
    the device's latest outcome that names one. Raises Device.DoesNotExist.
    """
    row = row_fetch(
        _SCORE_DEVICE_SQL, [device_id, device_id, device_id, device_id], prepare=True
    )
    if row is None:
        raise Device.DoesNotExist(f"device {device_id} does not exist")
    (first_seen_at, machine_id, connected, stale, last_beat, lease_id, lease_until,
     outcomes, successes, last_model) = row  # fmt: skip
    model_id = model_id or last_model or ""
    start = max(now - timedelta(hours=24), value_datetime(first_seen_at))
    series = rows_fetch(
        _score_series_sql(),
        [
            machine_id,
            db_datetime(start),
            machine_id,
            device_id,
            model_id,
            db_datetime(now - timedelta(hours=1)),
            device_id,
            model_id,
        ],
        prepare=True,
    )
    spans, newest, ttfts, recent = [], None, [], None
    for kind, span_id, started_at, ended_at, value in series:
        if kind == 0:
            spans.append(
                (span_id, value_datetime(started_at), value_datetime(ended_at))
            )
        elif kind == 1:
            newest = (span_id, value_datetime(started_at), value_datetime(ended_at))
        elif kind == 2:
            if value is not None:  # a value (SQLite), or their median (PostgreSQL)
                ttfts.append(value)
        else:
            recent = None if value is None else int(value)
    machine = Machine(
        id=value_uuid(machine_id),
        connected=bool(connected),
        stale=bool(stale),
        last_heartbeat_at=value_datetime(last_beat),
        lease_id=value_uuid(lease_id),
    )
    if lease_id is not None:
        machine.lease = CoordinatorLease(
            id=machine.lease_id, lease_until=value_datetime(lease_until)
        )
    return ScoreInputs(
        outcomes=outcomes,
        successes=successes or 0,
        online=online_fraction(
            machine=machine, start=start, spans=spans, latest=newest, now=now
        ),
        model_median=model_ttft_median(model_id=model_id, now=now)
        if model_id
        else None,
        device_median=statistics.median(ttfts) if model_id and ttfts else None,
        ttft_ms_recent=recent,
    )


def _score_write(
    *, device_id: int, inputs: ScoreInputs, slot_free: bool = False
) -> int:
    """Store the device's score (and free one slot with ``slot_free``); return it."""
    score = inputs.score
    slot = (
        ", slots_used = CASE WHEN slots_used > 0 THEN slots_used - 1 ELSE 0 END"
        if slot_free
        else ""
    )
    rows_changed(
        f"UPDATE hosts_device SET score = %s{slot} WHERE id = %s", [score, device_id]
    )
    return score


def catalog_model_ids() -> frozenset[str]:
    """The ids of the catalog's models."""
    from jobs.models import CatalogModel

    return frozenset(CatalogModel.objects.values_list("id", flat=True))


def catalog_vram_needs_mb() -> tuple[int, ...]:
    """The catalog models' per-request VRAM needs (MiB), for telemetry coalescing."""
    from jobs.models import CatalogModel

    return tuple(
        sorted(set(CatalogModel.objects.values_list("vram_per_request_mb", flat=True)))
    )


def heartbeat_interval_s() -> float:
    """The heartbeat interval (s) told to agents in ``welcome``."""
    return settings.BALLAST_HEARTBEAT_INTERVAL_S
