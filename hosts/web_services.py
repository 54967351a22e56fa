"""Writes behind the hosts' web pages and their beat tasks (issue 7).

The agent-facing writes (hello, heartbeats, outcomes) and registration live in
``hosts.services``; these are the owner's own changes (pause, settings, rename,
retire, key reset, token), the offline alerts and the score samples of the
machine page's chart. Each is a
transaction; races are settled with compare-and-set updates (row counts).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from . import emails
from .liveness import live_q
from .models import Device, Machine, ScoreSample, token_hash, token_new
from .regions import region_clean
from .services import (
    devices_retire,
    machine_connections_close,
    machine_name_clean,
    machine_name_save,
)

log = logging.getLogger("ballast.hosts")

SCORE_SAMPLE_KEEP_DAYS = 30


def machine_pause_set(*, machine: Machine, paused: bool) -> None:
    """Pause (no new jobs; running ones finish) or resume the machine, by its owner."""
    Machine.objects.filter(id=machine.id).update(paused=paused)


def machine_settings_update(
    *, machine: Machine, region: str, accepts_serverless: bool
) -> None:
    """Store the owner's region (a code of ``hosts.regions``, e.g. ``eu``, or
    empty) and serverless choice. Raises ValueError for an unknown region.

    Note: the agent's next ``hello`` also announces ``accepts_serverless``.
    """
    Machine.objects.filter(id=machine.id).update(
        region=region_clean(region), accepts_serverless=accepts_serverless
    )


@transaction.atomic
def machine_rename(*, machine: Machine, name: str) -> str:
    """Give the owner's machine a new name and return it (stripped).

    Raises ValueError for a name ``machine_name_clean`` refuses,
    MachineNameTaken when another of the owner's machines not retired has it
    (case ignored). Renters' device labels (``rig-1/gpu0``) follow the name.
    """
    name = machine_name_clean(name)
    machine_name_save(
        owner_id=machine.owner_id,
        name=name,
        exclude_id=machine.id,
        write=lambda: Machine.objects.filter(id=machine.id).update(name=name),
    )
    machine.name = name
    return name


class MachineRetireRefused(ValueError):
    """The machine cannot be retired now (a renter's rental is open on it)."""


@transaction.atomic
def machine_retire(*, machine: Machine, now: datetime | None = None) -> bool:
    """Retire the owner's machine: kept in the records (devices, jobs, earnings
    reference it), never eligible nor connecting again.

    One transaction on the locked row: ``retired_at`` set, the token revoked
    (``revoked:…``, as ``machine_token_revoke``), every device retired
    (``services.devices_retire``: no slot, no model loaded) and the open
    connection closed once this commits. Its name is free for a new machine.
    Returns False when it was retired already. Raises MachineRetireRefused
    while a rental (pending or live) is open on one of its devices: the renter
    paid for that device's time.
    """
    now = now or timezone.now()
    locked = Machine.objects.select_for_update().get(id=machine.id)
    if locked.retired_at is not None:
        return False
    rental_model = Device.rentals.rel.related_model  # jobs' Rental, a layer above
    rented = rental_model.objects.filter(
        device__machine_id=machine.id, status__in=rental_model.OPEN_STATUSES
    ).first()
    if rented is not None:
        until = f" until {rented.ends_at:%Y-%m-%d %H:%M} UTC" if rented.ends_at else ""
        raise MachineRetireRefused(
            f"a renter has rented {rented.device.label}{until}: retire the machine"
            " once the rental has ended"
        )
    Machine.objects.filter(id=machine.id).update(
        retired_at=now,
        token_hash=f"retired:{machine.id.hex}",
        token_prefix="",
        paused=True,
    )
    devices_retire(machine_id=machine.id, keep=[], now=now)
    if locked.connected:
        machine_connections_close(channel_names=[locked.channel_name])
    machine.retired_at, machine.token_prefix, machine.paused = now, "", True
    return True


def machine_key_reset(*, machine: Machine) -> bool:
    """Forget the machine's pinned Ed25519 key; the next ``hello`` pins a new one.

    Returns True when a key was pinned (and is now cleared).
    """
    return bool(
        Machine.objects.filter(id=machine.id)
        .exclude(public_key="")
        .update(public_key="")
    )


@transaction.atomic
def machine_token_rotate(*, machine: Machine) -> str:
    """Give the machine a new token and return it (plain, shown once); the old
    one stops at once: refused at connect and at ``hello``
    (``services.machine_hello``), and the connection open with it is closed
    (``services.machine_connections_close``, through the channel layer)."""
    token = token_new("bm")
    _token_replace(machine, token_hash(token), token[:10])
    return token


@transaction.atomic
def machine_token_revoke(*, machine: Machine) -> None:
    """Revoke the machine's token with no new one (rotate to get one back): the
    stored hash becomes a value no token hashes to (``revoked:…``), and the
    open connection is closed as on a rotation."""
    _token_replace(machine, f"revoked:{machine.id.hex}", "")


def _token_replace(machine: Machine, new_hash: str, prefix: str) -> None:
    locked = Machine.objects.select_for_update().get(id=machine.id)
    Machine.objects.filter(id=machine.id).update(
        token_hash=new_hash, token_prefix=prefix
    )
    machine.token_hash, machine.token_prefix = new_hash, prefix
    if locked.connected:
        machine_connections_close(channel_names=[locked.channel_name])


# --- offline alerts (DESIGN.md "What hosts and staff see") -------------------------
def silent_q(now: datetime) -> Q:
    """The Q of machines silent for over ``BALLAST_OFFLINE_ALERT_AFTER_S`` at ``now``.

    Last seen (``Machine.seen_until``: the recorded heartbeat, or the lease's end
    for a connected machine it vouched for) before the cutoff; a machine that never
    sent a heartbeat, or that its owner retired, is not silent.
    """
    cutoff = now - timedelta(seconds=settings.BALLAST_OFFLINE_ALERT_AFTER_S)
    vouched_since = Q(
        connected=True, stale=False, lease__isnull=False, lease__lease_until__gte=cutoff
    )
    return Q(last_heartbeat_at__lt=cutoff, retired_at__isnull=True) & ~vouched_since


def back_q(now: datetime) -> Q:
    """The Q of alerted machines that are back: live now (DESIGN.md rule 1) with a
    heartbeat recorded after the alert (the first heartbeat of the return)."""
    return live_q(now) & Q(
        offline_alert_sent_at__isnull=False,
        last_heartbeat_at__gt=F("offline_alert_sent_at"),
    )


def machine_offline_alert_try(*, machine_id, now: datetime) -> bool:
    """Email the owner that the machine went silent, if nobody has yet for this outage.

    A compare-and-set on ``offline_alert_sent_at`` (null → now), so concurrent
    workers send at most one email per outage. The null test is in the UPDATE's own
    WHERE, not only in the silence subquery: PostgreSQL re-checks a row another
    transaction just changed against the UPDATE's own conditions, not against a
    subquery's (two workers both sent before). The email is sent inside the
    transaction: if sending raises, the mark is rolled back and the next run
    retries. Returns True when this call sent it.
    """
    with transaction.atomic():
        won = Machine.objects.filter(
            id__in=Machine.objects.filter(silent_q(now), id=machine_id).values("id"),
            offline_alert_sent_at__isnull=True,
        ).update(offline_alert_sent_at=now)
        if not won:
            return False
        machine = Machine.objects.select_related("owner").get(id=machine_id)
        if machine.owner.email:
            emails.machine_offline(machine=machine)
    return True


def machine_back_alert_try(*, machine_id, now: datetime) -> bool:
    """Email the owner that an alerted machine is back online, once.

    Back means live (``back_q``) with a heartbeat recorded after the alert. A
    compare-and-set (alert mark → null), so one email per outage's end. Returns
    True when this call sent it.
    """
    with transaction.atomic():
        won = Machine.objects.filter(
            id__in=Machine.objects.filter(back_q(now), id=machine_id).values("id"),
            offline_alert_sent_at__isnull=False,
        ).update(offline_alert_sent_at=None)
        if not won:
            return False
        machine = Machine.objects.select_related("owner").get(id=machine_id)
        if machine.owner.email:
            emails.machine_back(machine=machine)
    return True


def machines_offline_alert(*, now: datetime | None = None) -> tuple[int, int]:
    """Send due offline and back-online emails; return (offline sent, back sent).

    Silent = last seen (``silent_q``) longer than ``BALLAST_OFFLINE_ALERT_AFTER_S``
    (s) ago. A machine that never sent a heartbeat is not alerted. Safe to run on several
    workers at once (each email is a compare-and-set).
    """
    now = now or timezone.now()
    silent = Machine.objects.filter(
        silent_q(now), offline_alert_sent_at__isnull=True
    ).values_list("id", flat=True)
    offline = sum(
        machine_offline_alert_try(machine_id=mid, now=now) for mid in list(silent)
    )
    returned = Machine.objects.filter(back_q(now)).values_list("id", flat=True)
    back = sum(
        machine_back_alert_try(machine_id=mid, now=now) for mid in list(returned)
    )
    if offline or back:
        log.info("offline alerts: %d offline, %d back", offline, back)
    return offline, back


# --- score history ------------------------------------------------------------------
@transaction.atomic
def score_samples_take(*, now: datetime | None = None) -> int:
    """Store every device's current score (0–100) as a sample (retired devices
    none); prune old ones.

    Keeps ``SCORE_SAMPLE_KEEP_DAYS`` (30) days. Returns the number of samples taken.
    """
    now = now or timezone.now()
    samples = [
        ScoreSample(device_id=device_id, score=score, taken_at=now)
        for device_id, score in Device.objects.filter(
            retired_at__isnull=True
        ).values_list("id", "score")
    ]
    ScoreSample.objects.bulk_create(samples)
    ScoreSample.objects.filter(
        taken_at__lt=now - timedelta(days=SCORE_SAMPLE_KEEP_DAYS)
    ).delete()
    return len(samples)
