"""A machine's heartbeats: what of them reaches the database, and the process
lease that vouches for steady ones (``hosts.liveness``).

Liveness and telemetry are coalesced in memory (``HeartbeatMemo``); a write is a
transaction, called through ``db_call``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from catalog.selectors import catalog_model_ids

from ..models import CoordinatorLease, Device, DeviceModel, Machine
from .spot_checks import spot_check_mark_due
from .uptime import online_span_close, online_span_extend


@dataclass(frozen=True)
class HeartbeatResult:
    """What a heartbeat changed: models that gained capacity, and how many slots."""

    models_with_capacity: frozenset[str]
    slots_gained: int = 0


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
            _models_key(report),
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


def _models_key(report: dict) -> tuple:
    """A device report's loaded models with the weights declared for each
    (``((model id, sha256, quantization), …)``): a change of either is written."""
    weights = report.get("weights", {})
    return tuple(
        (model, w.get("sha256", ""), w.get("quantization", ""))
        for model in report["loaded_models"]
        for w in [weights.get(model, {})]
    )


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
            _models_key(report),
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

    The online span is extended or opened only when this heartbeat makes the
    machine live (it was ``stale``: the first of a connection, or the first
    after a stale mark); a liveness write while live (a pause flag changed,
    the agent draining before a restart) leaves its open span as it is.

    ``now`` must be when the heartbeat was received (the recorded time never runs
    ahead of the real one). With ``channel_name``, liveness is written only while
    that is still the machine's connection. ``heartbeat["devices"]`` holds the
    reports to write (all of them, or those ``heartbeat_changes`` picked); a
    loaded model that is not in the catalog is ignored (no row: a host cannot
    grow the table with made-up ids); a loaded model's row keeps the weights
    its report declares (``weights``: digest and quantization, '' when it
    says none), a change of digest counting as capacity gained. Returns the models that gained capacity
    (newly loaded or more slots), so the caller can wake requests waiting for
    them.
    """
    now = now or timezone.now()
    if liveness:
        machines = Machine.objects.filter(id=machine_id)
        if channel_name is not None:
            machines = machines.filter(channel_name=channel_name)
        fields = {"last_heartbeat_at": now, "host_paused": heartbeat["paused"]}
        # a span opens (or goes on) only when the machine becomes live: while
        # it is live its latest span is open (counted until now), and a pause
        # flag written then must not start another one over it
        if machines.filter(stale=True).update(**fields, stale=False):
            online_span_extend(machine_id=machine_id, now=now)
        else:
            machines.update(**fields)
    gained: set[str] = set()
    slots_gained = 0
    if not heartbeat["devices"]:
        return HeartbeatResult(models_with_capacity=frozenset())
    devices = {
        d.index: d
        for d in Device.objects.filter(machine_id=machine_id, retired_at__isnull=True)
    }
    for report in heartbeat["devices"]:
        device = devices.get(report["index"])
        if device is None:
            continue  # not in the latest hello (retired or unknown): ignored
        loaded_now = set(report["loaded_models"])
        existing = {dm.model_id: dm for dm in DeviceModel.objects.filter(device=device)}
        unknown = loaded_now - existing.keys()
        if unknown:  # rows only for the catalog's models (a host's list is bounded)
            loaded_now -= unknown - catalog_model_ids()
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
            declared = report.get("weights", {}).get(model_id, {})
            weights = {
                "weights_sha256": declared.get("sha256", ""),
                "weights_quantization": declared.get("quantization", ""),
            }
            if dm is None:
                DeviceModel.objects.create(
                    device=device,
                    model_id=model_id,
                    loaded=True,
                    first_loaded_at=now,
                    **weights,
                )
                spot_check_mark_due(device_id=device.id, reason="first_load", now=now)
            elif not dm.loaded or weights["weights_sha256"] != dm.weights_sha256:
                DeviceModel.objects.filter(id=dm.id).update(loaded=True, **weights)
            elif weights["weights_quantization"] != dm.weights_quantization:
                DeviceModel.objects.filter(id=dm.id).update(**weights)
                continue
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


def heartbeat_interval_s() -> float:
    """The heartbeat interval (s) told to agents in ``welcome``."""
    return settings.BALLAST_HEARTBEAT_INTERVAL_S
