"""Machines (one agent each) and the coordinator processes' liveness leases,
DESIGN.md "Vocabulary". Rules about one row live here (``Machine.is_online``).
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.db.models.functions import Lower

from ..regions import region_validate


def token_hash(token: str) -> str:
    """Return the sha256 hex digest under which a secret token is stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_new(prefix: str) -> str:
    """Return a new random secret token like ``bm_…`` (43 url-safe chars of entropy)."""
    return f"{prefix}_{secrets.token_urlsafe(32)}"


class CoordinatorLease(models.Model):
    """One coordinator process's liveness lease (DESIGN.md "Picking a device", rule 1).

    Renewed by one loop of the process every ``BALLAST_LEASE_RENEW_S`` to
    ``lease_until`` = (the time its check began) + ``BALLAST_LEASE_S``. It says: as of
    ``lease_until``, every machine connected to this process, pointing at this lease
    and not marked ``stale``, had a heartbeat under ``BALLAST_HEARTBEAT_MAX_AGE_S``
    old. The loop marks stale, *before* renewing, every machine whose last heartbeat
    is older than ``hosts.liveness.stale_after_s()``. If the process stalls or dies
    the lease lapses and its machines are ineligible at once. ``name`` is for staff
    (host and pid).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    lease_until = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name or self.id} until {self.lease_until:%H:%M:%S}"


class Machine(models.Model):
    """One computer running one agent; authenticates with a machine token.

    The token is stored hashed (sha256); the plain token is shown once, when the
    machine is created. ``public_key`` is pinned by the first ``hello``
    (PROTOCOL.md §2) and only the owner can reset it. ``name`` is unique among
    the owner's machines not retired, whatever its case
    (``machine_unique_name_per_owner``); ``region`` is one of ``hosts.regions``
    or empty. A retired machine (``retired_at``) is kept with its devices, jobs
    and earnings, but its token no longer connects and its devices are retired
    (``hosts.web_services.machine_retire``).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="machines"
    )
    name = models.CharField(max_length=100)
    region = models.CharField(
        max_length=32, blank=True, db_index=True, validators=[region_validate]
    )
    token_hash = models.CharField(max_length=64, unique=True)
    token_prefix = models.CharField(max_length=12)
    public_key = models.CharField(max_length=64, blank=True)
    agent_version = models.CharField(max_length=32, blank=True)
    engine_name = models.CharField(max_length=64, blank=True)
    engine_version = models.CharField(max_length=64, blank=True)
    accepts_serverless = models.BooleanField(
        default=True, help_text="the owner's choice (dashboard)"
    )
    agent_accepts_serverless = models.BooleanField(
        default=True,
        db_default=True,
        help_text="the agent's hello: both must accept serverless jobs",
    )
    paused = models.BooleanField(default=False, help_text="paused by its owner")
    features = models.CharField(
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text="what its engine declared it does beyond text (hello.features):"
        " known names, space-separated, sorted",
    )
    verifies = models.BooleanField(
        default=False,
        db_default=False,
        help_text="its engine scores answers by prefill (hello.verifies): it may be"
        " sent verify offers (DESIGN.md \"Verifying real answers\")",
    )
    host_paused = models.BooleanField(default=False, help_text="paused by the agent")
    connected = models.BooleanField(default=False)
    channel_name = models.CharField(max_length=200, blank=True)
    connected_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="a heartbeat at least this recent was received (written on changes)",
    )
    lease = models.ForeignKey(
        CoordinatorLease,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="machines",
        help_text="the coordinator process whose lease vouches for this connection",
    )
    stale = models.BooleanField(
        default=True,
        db_default=True,
        help_text="no heartbeat recent enough for the lease to vouch for (or none yet)",
    )
    offline_alert_sent_at = models.DateTimeField(null=True, blank=True)
    suspected_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="under suspicion from its first hello: its owner had a quarantined"
        " device then (hosts.services.trust.machine_suspected_since)",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    retired_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="retired by its owner: kept in the records, never connects again",
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                Lower("name"),
                "owner",
                condition=models.Q(retired_at__isnull=True),
                name="machine_unique_name_per_owner",
                violation_error_message="You already have a machine of this name.",
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def build(self) -> str:
        """The build this machine runs: ``agent version + engine name/version``."""
        return f"agent {self.agent_version} / {self.engine_name} {self.engine_version}"

    def serves(self, features) -> bool:
        """Whether this machine's engine declared every one of ``features``
        (names of ``hosts.protocol.FEATURES``) in its latest ``hello``."""
        declared = self.features.split()
        return all(feature in declared for feature in features)

    def is_online(self, now: datetime) -> bool:
        """True when the websocket is open and the last heartbeat is fresh.

        DESIGN.md "Picking a device", rule 1: heartbeat under
        ``BALLAST_HEARTBEAT_MAX_AGE_S`` (30 s) old and the connection open. Fresh
        means either proof: the recorded ``last_heartbeat_at`` is under the max age,
        or the machine is not ``stale`` and its process's lease runs past ``now``
        (see ``CoordinatorLease``). The same rule as ``hosts.liveness.live_q`` and
        the SQL of ``jobs.selectors``. Reads ``self.lease`` (select_related it).
        """
        if not self.connected:
            return False
        max_age = timedelta(seconds=settings.BALLAST_HEARTBEAT_MAX_AGE_S)
        if (
            self.last_heartbeat_at is not None
            and now - self.last_heartbeat_at < max_age
        ):
            return True
        return (
            not self.stale
            and self.lease_id is not None
            and self.lease.lease_until > now
        )

    def seen_until(self) -> datetime | None:
        """The latest time this machine is known to have counted as online, or None.

        The lease's end for a connected, non-stale machine it vouches for (a lapsed
        lease: when its process stopped vouching), else the recorded last heartbeat.
        Used for "gone more than 10 min" and the offline alerts. Reads ``self.lease``.
        """
        seen = self.last_heartbeat_at
        if self.connected and not self.stale and self.lease_id is not None:
            until = self.lease.lease_until
            seen = until if seen is None else max(seen, until)
        return seen
