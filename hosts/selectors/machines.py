"""Reads behind the hosts' dashboard and a machine page's head: machines
with their status and earnings, who may read a machine, what its page says at
its top. Amounts are integer nano-USD; times timezone-aware UTC."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import Sum
from django.http import Http404

from billing.models import Earning

from ..models import (
    Device,
    Machine,
)


@dataclass
class Earnings:
    """A host's earnings in nano-USD: still in the 24 h hold, and available."""

    held_nano: int = 0
    available_nano: int = 0

@dataclass
class MachineRow:
    """One row of the dashboard: a machine and its live state."""

    machine: Machine
    status: str  # "online" | "paused" | "offline"
    devices: list[Device]
    slots_used: int
    slots_total: int
    quarantined: int
    earnings: Earnings = field(default_factory=Earnings)

    @property
    def scores(self) -> list[int]:
        """Each device's score (0–100), in device order."""
        return [d.score for d in self.devices]

def machine_status(machine: Machine, now: datetime) -> str:
    """``retired`` (by its owner), ``waiting`` (no heartbeat ever: see
    ``machine_waiting``), ``offline`` (no fresh heartbeat or closed socket),
    ``paused`` (owner or agent), or ``online``.

    Liveness as in ``Machine.is_online`` (DESIGN.md rule 1, ``hosts.liveness``).
    """
    if machine.retired_at is not None:
        return "retired"
    if not machine.is_online(now):
        return "waiting" if machine_waiting(machine) else "offline"
    if machine.paused or machine.host_paused:
        return "paused"
    return "online"

def machine_of_owner(*, user: AbstractBaseUser, machine_id) -> Machine:
    """The user's own machine; raises Http404 for anyone else's (no hint it exists)."""
    machine = (
        Machine.objects.filter(id=machine_id, owner_id=user.pk)
        .select_related("lease")
        .first()
    )
    if machine is None:
        raise Http404("no such machine")
    return machine

def machine_of_viewer(*, user: AbstractBaseUser, machine_id) -> tuple[Machine, bool]:
    """(the machine, whether ``user`` owns it) for its pages: its owner's, or
    any machine for staff (who read it, never change it: the page's controls
    are the owner's). Raises Http404 for anyone else (no hint it exists)."""
    if not getattr(user, "is_staff", False):
        return machine_of_owner(user=user, machine_id=machine_id), True
    machine = Machine.objects.filter(id=machine_id).select_related("lease").first()
    if machine is None:
        raise Http404("no such machine")
    return machine, machine.owner_id == user.pk

def earnings_by_machine(*, machines: list[Machine]) -> dict:
    """Map machine id → Earnings (held and released, nano-USD) over its devices."""
    result = {m.id: Earnings() for m in machines}
    rows = (
        Earning.objects.filter(device__machine__in=machines)
        .exclude(status=Earning.Status.REVERSED)
        .values("device__machine_id", "status")
        .annotate(total=Sum("amount_nano"))
    )
    for row in rows:
        earnings = result[row["device__machine_id"]]
        if row["status"] == Earning.Status.HELD:
            earnings.held_nano += row["total"] or 0
        else:
            earnings.available_nano += row["total"] or 0
    return result

def host_earnings(*, user: AbstractBaseUser) -> Earnings:
    """All the host's earnings: held and released (available or since paid out), nano-USD."""
    rows = (
        Earning.objects.filter(host_id=user.pk)
        .values("status")
        .annotate(total=Sum("amount_nano"))
    )
    totals = {row["status"]: row["total"] or 0 for row in rows}
    return Earnings(
        held_nano=totals.get(Earning.Status.HELD, 0),
        available_nano=totals.get(Earning.Status.RELEASED, 0),
    )

def machine_rows(*, user: AbstractBaseUser, now: datetime) -> list[MachineRow]:
    """The dashboard's rows: each of the user's machines not retired, with its
    live state."""
    machines = list(
        Machine.objects.filter(owner_id=user.pk, retired_at__isnull=True)
        .select_related("lease")
        .prefetch_related("devices")
        .order_by("name")
    )
    earnings = earnings_by_machine(machines=machines)
    rows = []
    for machine in machines:
        devices = list(machine.devices.all())
        rows.append(
            MachineRow(
                machine=machine,
                status=machine_status(machine, now),
                devices=devices,
                slots_used=sum(d.slots_used for d in devices),
                slots_total=sum(d.slots_total for d in devices),
                quarantined=sum(1 for d in devices if d.quarantined),
                earnings=earnings[machine.id],
            )
        )
    return rows

def machines_retired(*, user: AbstractBaseUser) -> list[tuple[Machine, Earnings]]:
    """The user's retired machines, last retired first, each with its earnings."""
    machines = list(
        Machine.objects.filter(owner_id=user.pk, retired_at__isnull=False).order_by(
            "-retired_at"
        )
    )
    earnings = earnings_by_machine(machines=machines)
    return [(m, earnings[m.id]) for m in machines]

def machine_waiting(machine: Machine) -> bool:
    """True until the machine's first heartbeat was recorded (``last_heartbeat_at``
    is set by the first, ``hosts.services.machine_heartbeat``), for a machine
    not retired: its page says what to check."""
    return machine.last_heartbeat_at is None and machine.retired_at is None

RELEASE_SHOWN = timedelta(days=7)  # how long the page says staff released a device

@dataclass(frozen=True)
class MachineNotices:
    """What the machine page says at its top: ``rented``, its devices' open
    rentals (``jobs``' rows read through each device's ``rentals``: ``live``
    takes only its renter's jobs until ``ends_at``; ``pending`` waits for a
    passed spot check); ``decisions``, staff's latest quarantine decision
    (``QuarantineDecision``) of each device while it holds: a quarantine while
    the device is quarantined by staff, a release for ``RELEASE_SHOWN`` while
    it is not quarantined."""

    rented: list
    decisions: list

def machine_notices(*, machine: Machine, now: datetime) -> MachineNotices:
    rented, decisions = [], []
    for device in machine.devices.filter(retired_at__isnull=True).order_by("index"):
        rented += list(
            device.rentals.filter(status__in=("pending", "live"))
            .select_related("device")
            .order_by("starts_at")
        )
        latest = device.quarantine_decisions.select_related("device").first()
        if latest is None:
            continue
        by_staff = device.quarantined and (
            device.quarantine_reason == Device.QuarantineReason.STAFF
        )
        if latest.action == "quarantine" and by_staff:
            decisions.append(latest)
        elif (
            latest.action == "release"
            and not device.quarantined
            and latest.created_at > now - RELEASE_SHOWN
        ):
            decisions.append(latest)
    return MachineNotices(rented=rented, decisions=decisions)
