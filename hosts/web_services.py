"""Writes behind the hosts' web pages and their beat tasks (issue 7).

The agent-facing writes (hello, heartbeats, outcomes) live in ``hosts.services``;
these are the owner's own changes (register, pause, settings, key reset), the
offline alerts and the score samples of the machine page's chart. Each is a
transaction; races are settled with compare-and-set updates (row counts).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from . import emails
from .models import Device, Machine, ScoreSample

log = logging.getLogger("ballast.hosts")

SCORE_SAMPLE_KEEP_DAYS = 30


def machine_pause_set(*, machine: Machine, paused: bool) -> None:
    """Pause (no new jobs; running ones finish) or resume the machine, by its owner."""
    Machine.objects.filter(id=machine.id).update(paused=paused)


def machine_settings_update(
    *, machine: Machine, region: str, accepts_serverless: bool
) -> None:
    """Store the owner's region (lower-cased, e.g. ``eu``) and serverless choice.

    Note: the agent's next ``hello`` also announces ``accepts_serverless``.
    """
    Machine.objects.filter(id=machine.id).update(
        region=region.strip().lower(), accepts_serverless=accepts_serverless
    )


def machine_key_reset(*, machine: Machine) -> bool:
    """Forget the machine's pinned Ed25519 key; the next ``hello`` pins a new one.

    Returns True when a key was pinned (and is now cleared).
    """
    return bool(
        Machine.objects.filter(id=machine.id)
        .exclude(public_key="")
        .update(public_key="")
    )


# --- offline alerts (DESIGN.md "What hosts and staff see") -------------------------
def machine_offline_alert_try(*, machine_id, now: datetime) -> bool:
    """Email the owner that the machine went silent, if nobody has yet for this outage.

    A compare-and-set on ``offline_alert_sent_at`` (null → now), so concurrent
    workers send at most one email per outage. The email is sent inside the
    transaction: if sending raises, the mark is rolled back and the next run
    retries. Returns True when this call sent it.
    """
    cutoff = now - timedelta(seconds=settings.BALLAST_OFFLINE_ALERT_AFTER_S)
    with transaction.atomic():
        won = Machine.objects.filter(
            id=machine_id,
            offline_alert_sent_at__isnull=True,
            last_heartbeat_at__lt=cutoff,
        ).update(offline_alert_sent_at=now)
        if not won:
            return False
        machine = Machine.objects.select_related("owner").get(id=machine_id)
        if machine.owner.email:
            emails.machine_offline(machine=machine)
    return True


def machine_back_alert_try(*, machine_id, now: datetime) -> bool:
    """Email the owner that an alerted machine is back online, once.

    Back means connected with a heartbeat newer than the alert and fresher than
    ``BALLAST_HEARTBEAT_MAX_AGE_S``. A compare-and-set (alert mark → null), so one
    email per outage's end. Returns True when this call sent it.
    """
    fresh = now - timedelta(seconds=settings.BALLAST_HEARTBEAT_MAX_AGE_S)
    with transaction.atomic():
        won = Machine.objects.filter(
            id=machine_id,
            offline_alert_sent_at__isnull=False,
            connected=True,
            last_heartbeat_at__gte=fresh,
            last_heartbeat_at__gt=F("offline_alert_sent_at"),
        ).update(offline_alert_sent_at=None)
        if not won:
            return False
        machine = Machine.objects.select_related("owner").get(id=machine_id)
        if machine.owner.email:
            emails.machine_back(machine=machine)
    return True


def machines_offline_alert(*, now: datetime | None = None) -> tuple[int, int]:
    """Send due offline and back-online emails; return (offline sent, back sent).

    Silent = last heartbeat older than ``BALLAST_OFFLINE_ALERT_AFTER_S`` (s). A
    machine that never sent a heartbeat is not alerted. Safe to run on several
    workers at once (each email is a compare-and-set).
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.BALLAST_OFFLINE_ALERT_AFTER_S)
    silent = Machine.objects.filter(
        offline_alert_sent_at__isnull=True, last_heartbeat_at__lt=cutoff
    ).values_list("id", flat=True)
    offline = sum(
        machine_offline_alert_try(machine_id=mid, now=now) for mid in list(silent)
    )
    fresh = now - timedelta(seconds=settings.BALLAST_HEARTBEAT_MAX_AGE_S)
    returned = Machine.objects.filter(
        offline_alert_sent_at__isnull=False,
        connected=True,
        last_heartbeat_at__gte=fresh,
        last_heartbeat_at__gt=F("offline_alert_sent_at"),
    ).values_list("id", flat=True)
    back = sum(
        machine_back_alert_try(machine_id=mid, now=now) for mid in list(returned)
    )
    if offline or back:
        log.info("offline alerts: %d offline, %d back", offline, back)
    return offline, back


# --- score history ------------------------------------------------------------------
@transaction.atomic
def score_samples_take(*, now: datetime | None = None) -> int:
    """Store every device's current score (0–100) as a sample; prune old ones.

    Keeps ``SCORE_SAMPLE_KEEP_DAYS`` (30) days. Returns the number of samples taken.
    """
    now = now or timezone.now()
    samples = [
        ScoreSample(device_id=device_id, score=score, taken_at=now)
        for device_id, score in Device.objects.values_list("id", "score")
    ]
    ScoreSample.objects.bulk_create(samples)
    ScoreSample.objects.filter(
        taken_at__lt=now - timedelta(days=SCORE_SAMPLE_KEEP_DAYS)
    ).delete()
    return len(samples)
