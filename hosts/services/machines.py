"""A machine's agent's connection (authenticate, hello, disconnect, close) and
the reports it sends besides heartbeats (failed loads, benchmarks).

Every write is a transaction; consumers call them through ``db_call``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ..models import (
    Benchmark,
    Device,
    DeviceModel,
    FailedCapability,
    Machine,
    token_hash,
)
from .placement import device_placement_judge
from .spot_checks import spot_check_mark_due
from .trust import device_quarantine, device_start_reason, machine_first_hello_judge
from .uptime import online_span_close

log = logging.getLogger("ballast.hosts")

RETURN_AFTER = timedelta(minutes=10)
BENCHMARKS_KEPT = 20  # per device and model: a host cannot grow its page without end
FAILED_BUILDS_KEPT = 5  # failed loads kept per device and model (the latest builds)


class KeyMismatch(Exception):
    """The ``hello`` announced a public key other than the one pinned for the machine."""


class MachineRefused(Exception):
    """The connection's token is no longer the machine's (rotated or revoked), the
    machine is retired, or the machine's owner is deactivated."""


def machine_authenticate(*, token: str) -> Machine | None:
    """Return the machine whose token this is (its owner active, the machine not
    retired), or None."""
    if not token:
        return None
    return Machine.objects.filter(
        token_hash=token_hash(token), owner__is_active=True, retired_at__isnull=True
    ).first()


def machine_connections_close(*, channel_names: Iterable[str]) -> None:
    """Once the caller's transaction commits, close these machine connections
    (a ``machine.revoked`` message to each, through the channel layer, so on
    whichever coordinator process holds it). Outside a transaction, at once. A
    layer that cannot be reached is logged."""
    channels = [name for name in channel_names if name]
    if not channels:
        return

    def send() -> None:
        layer = get_channel_layer()
        for channel in channels:
            try:
                async_to_sync(layer.send)(channel, {"type": "machine.revoked"})
            except Exception:
                log.exception("closing machine connection %s failed", channel)

    transaction.on_commit(send)


def machines_of_owner_close(*, owner_id: int) -> None:
    """Close every open connection of the owner's machines (a deactivated
    owner's machines stop at once; ``machine_authenticate`` refuses them)."""
    machine_connections_close(
        channel_names=Machine.objects.filter(owner_id=owner_id, connected=True)
        .exclude(channel_name="")
        .values_list("channel_name", flat=True)
    )


@transaction.atomic
def machine_hello(
    *,
    machine_id: str,
    channel_name: str,
    hello: dict,
    now: datetime | None = None,
    lease_id=None,
    token_hash: str | None = None,
) -> str:
    """Record a ``hello``: pin or check the key, store the build and the
    features its engine declares, upsert devices.

    Marks the machine connected on ``channel_name``, vouched for by the process
    lease ``lease_id`` (None: by its recorded heartbeats only) and ``stale`` until
    its first heartbeat (``hosts.liveness``). Closes the online span of a previous
    connection still counted online (a process that died: at its lease's end).
    A device back after more than 10 min gone, or back after being retired, gets
    a spot check due (DESIGN.md "Spot checks"). A device new to the machine
    starts in the machine's worst state (``trust.device_start_reason``: a
    renamed device buys nothing), as does a retired one declared again when a
    device the machine has had is quarantined, and a new machine of an owner with a
    quarantined device starts under suspicion (``trust.machine_first_hello_judge``).
    A device declaring another name, kind or memory is judged again for
    placement (``placement.device_placement_judge``).
    Devices of the machine missing
    from this ``hello`` are retired (``retired_at``; kept in the records, no
    slot, no model loaded: never eligible nor rentable) until a ``hello``
    declares them again. Returns the channel of the connection it replaces ('' if
    none), which the caller closes. Raises KeyMismatch when a key is already
    pinned and differs (DESIGN.md: refused until the owner resets it), and
    MachineRefused when ``token_hash`` (the hash of the token the connection
    authenticated with) is no longer the machine's, the machine is retired, or
    its owner is inactive.
    The caller checked the hello's ``proof`` of the key (``billing.receipts.
    challenge_verify``).
    """
    now = now or timezone.now()
    machine = (
        Machine.objects.select_for_update(of=("self",))
        .select_related("owner")
        .get(id=machine_id)
    )
    if (
        not machine.owner.is_active
        or machine.retired_at is not None
        or (token_hash is not None and machine.token_hash != token_hash)
    ):
        raise MachineRefused(
            "this machine's token was rotated or revoked, the machine retired, or"
            " its owner deactivated"
        )
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
    machine.features = " ".join(hello.get("features", ()))
    machine.verifies = hello.get("verifies", False)
    machine.connected = True
    machine.channel_name = channel_name
    machine.connected_at = now
    machine.lease_id = lease_id
    machine.stale = True
    machine.save()
    retired = set(
        Device.objects.filter(machine=machine, retired_at__isnull=False).values_list(
            "index", flat=True
        )
    )
    machine_first_hello_judge(machine=machine, now=now)
    start_reason = device_start_reason(machine=machine)
    declared = {
        d.index: (d.name, d.kind, d.vram_total_mb)
        for d in Device.objects.filter(machine=machine)
    }
    for dev in hello["devices"]:
        device, created = Device.objects.update_or_create(
            machine=machine,
            index=dev["index"],
            defaults={
                "name": dev["name"],
                "kind": dev.get("kind", Device.Kind.GPU),
                "vram_total_mb": dev["vram_total_mb"],
                "retired_at": None,
            },
        )
        if not created and declared[device.index] != (
            device.name,
            device.kind,
            device.vram_total_mb,
        ):  # placed by what was measured of what it declares now
            device_placement_judge(device_id=device.id)
        returning = not created and dev["index"] in retired
        if start_reason and (
            created or (returning and start_reason == Device.QuarantineReason.INHERITED)
        ):  # (a retired index declared again is a renamed device too)
            device_quarantine(device_id=device.id, reason=start_reason, now=now)
        elif came_back or returning:
            spot_check_mark_due(device_id=device.id, reason="return", now=now)
    devices_retire(
        machine_id=machine.id,
        keep=[dev["index"] for dev in hello["devices"]],
        now=now,
    )
    return previous_channel


def devices_retire(*, machine_id, keep: list[int], now: datetime) -> int:
    """Retire the machine's devices whose index is not in ``keep`` (those of its
    latest ``hello``): ``retired_at`` set, no slots, no model loaded. Returns how
    many were retired now. Call inside the hello's transaction."""
    gone = Device.objects.filter(
        machine_id=machine_id, retired_at__isnull=True
    ).exclude(index__in=keep)
    ids = list(gone.values_list("id", flat=True))
    if ids:
        Device.objects.filter(id__in=ids).update(retired_at=now, slots_total=0)
        DeviceModel.objects.filter(device_id__in=ids).update(loaded=False)
    return len(ids)


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
def capability_failed_record(*, machine_id: str, report: dict) -> FailedCapability:
    """Record a ``model_load_failed`` for the machine's current build.

    Keeps the engine's error text, counts repeats; the model is marked not loaded on
    that device so it is not offered there. Only the ``FAILED_BUILDS_KEPT`` (5)
    builds last reported are kept per device and model (a host changing its
    build string cannot grow the table).
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
    same = FailedCapability.objects.filter(
        machine=machine, device_index=report["device"], model_id=report["model"]
    )
    keep = list(
        same.order_by("-last_at", "-id").values_list("id", flat=True)[
            :FAILED_BUILDS_KEPT
        ]
    )
    same.exclude(id__in=keep).delete()
    return capability


def benchmark_record(*, machine_id: str, report: dict) -> Benchmark | None:
    """Store a benchmark measured on the machine's own hardware (the last 20 per
    device and model are kept); None for an unknown device."""
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
