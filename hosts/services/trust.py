"""What a machine and its owner carry, whatever a device is called (DESIGN.md
"Fair to honest hosts": quarantine, suspicion and held earnings belong to the
machine and its owner, not to a device index a host can rename).

A device is named by the index its agent announces, so a host can rename one
at will. Renaming buys nothing:

- a device new to a machine starts in the machine's worst state
  (``device_start_reason``): quarantined when a device of the machine is
  (``inherited``, 3 passed checks in a row to leave), else held out of renter
  work until it passes a check (``new_device``) when the machine had devices
  before or is under suspicion;
- suspicion (verified more, ``trust.verification.rate``) starts at the
  machine's last failed check, whichever device failed it, or at the first
  ``hello`` of a new machine of an owner with a quarantined device
  (``machine_suspected_since``); each device earns its way back with its own
  passes;
- a failed check reverses the held earnings of every device the machine has
  had (``billing.services.holds.earnings_reverse_held``, by machine).

The score stays per device (DESIGN.md "Reliability score"), over its last
outcomes and its machine's retired devices' (``scores.device_score_inputs``):
a renamed device goes on from its predecessor's record, not from 60.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import connection

from ballast.rows import value

from ..models import Device, DeviceOutcome, Machine
from .spot_checks import spot_check_mark_due

Reason = Device.QuarantineReason


def device_quarantine(*, device_id: int, reason: str, now: datetime) -> bool:
    """Quarantine the device for ``reason`` (a ``Device.QuarantineReason``),
    stamped ``now``, with a spot check marked due. A device already
    quarantined for a lighter reason (``new_device``) takes the heavier one
    (it must then pass 3 in a row); one quarantined for any other reason keeps
    its reason and stamp. Returns True when the device was not quarantined
    before. In the caller's transaction."""
    newly = Device.objects.filter(id=device_id, quarantined=False).update(
        quarantined=True, quarantined_at=now, quarantine_reason=reason
    )
    if not newly and reason != Reason.NEW_DEVICE:
        Device.objects.filter(id=device_id, quarantine_reason=Reason.NEW_DEVICE).update(
            quarantine_reason=reason
        )
    if newly:
        spot_check_mark_due(device_id=device_id, reason="quarantine", now=now)
    return bool(newly)


def machine_suspected_since(*, machine_id) -> datetime | None:
    """When the machine's present suspicion began, or None: the latest of its
    last failed check (a failed ``spot_check`` outcome of any device it has
    had, retired ones included) and ``Machine.suspected_at`` (a new machine of
    an owner with a quarantined device). One fixed statement
    (``suspected_since_sql``)."""
    since, params = suspected_since_sql("k.id")
    pk = Machine._meta.pk
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {since} FROM hosts_machine k WHERE k.id = %s",
            [*params, pk.get_db_prep_value(pk.to_python(machine_id), connection)],
        )
        row = cursor.fetchone()
    return None if row is None else value(_SUSPECTED_AT, row[0])


_SUSPECTED_AT = Machine._meta.get_field("suspected_at")


def suspected_since_sql(machine: str) -> tuple[str, list]:
    """``machine_suspected_since`` as SQL, for a statement that reads more
    with it (``trust.verification.rate``): a scalar sub-select of when the
    present suspicion of the machine whose id is the SQL expression
    ``machine`` began (NULL: none), and its parameters. ``machine`` is a
    column of the enclosing statement (``"d.machine_id"``), used twice; the
    same text on PostgreSQL and SQLite."""
    sql = (
        "(SELECT MAX(t.at) FROM ("
        "SELECT MAX(o.created_at) AS at FROM hosts_deviceoutcome o"
        " JOIN hosts_device od ON od.id = o.device_id"
        f" WHERE od.machine_id = {machine} AND o.source = %s AND NOT o.success"
        " UNION ALL SELECT sm.suspected_at FROM hosts_machine sm"
        f" WHERE sm.id = {machine}) t)"
    )
    return sql, [DeviceOutcome.Source.SPOT_CHECK.value]


def machine_first_hello_judge(*, machine: Machine, now: datetime) -> bool:
    """At a machine's first ``hello`` (it has no device yet): put it under
    suspicion from ``now`` when another machine of its owner (retired ones
    included) has a quarantined device. Returns True when it did. Writes
    ``machine.suspected_at``; in the hello's transaction."""
    if Device.objects.filter(machine=machine).exists():
        return False
    if not (
        Device.objects.filter(machine__owner_id=machine.owner_id, quarantined=True)
        .exclude(machine=machine)
        .exists()
    ):
        return False
    machine.suspected_at = now
    Machine.objects.filter(id=machine.id).update(suspected_at=now)
    return True


def device_start_reason(*, machine: Machine) -> str:
    """The quarantine reason a device new to ``machine`` starts with ('' for
    none): ``inherited`` when a device the machine has had (retired ones
    included) is quarantined; ``new_device`` (held out of renter work until it
    passes a check) when the machine has had a device, or is under suspicion
    from its first hello (``machine_first_hello_judge``); '' for the first
    devices of a machine of an owner with nothing against it, and instead of
    ``new_device`` with ``BALLAST_SPOT_CHECKS`` off (no check could release
    it). Call before the new devices are stored."""
    devices = Device.objects.filter(machine=machine)
    if devices.filter(quarantined=True).exists():
        return Reason.INHERITED
    checked = settings.BALLAST_SPOT_CHECKS
    if checked and (devices.exists() or machine.suspected_at is not None):
        return Reason.NEW_DEVICE
    return ""
