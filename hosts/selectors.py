"""Reads behind the hosts' pages: dashboard rows, score parts, machine page data.

Amounts are integer nano-USD; times timezone-aware UTC; sizes MiB; temperatures °C.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import F, Sum
from django.db.models.functions import TruncDate
from django.http import Http404

from billing.models import Earning
from catalog.models import CatalogModel

from .checkpools import models_unchecked
from .models import (
    Benchmark,
    Device,
    DeviceModel,
    DeviceOutcome,
    Machine,
    ScoreSample,
)
from .scoring import PRIOR, WINDOW, score_parts
from .segments import segment_earned_nothing
from .services import device_score_inputs, spot_checks_recent


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


@dataclass
class ScoreParts:
    """The three parts of a device's score (DESIGN.md "Reliability score").

    ``success`` is out of 70, ``uptime`` out of 20, ``latency`` out of 10; ``computed``
    is their sum; with ``outcomes`` < 50 the score leans toward 60 by ``weight``
    (= outcomes/50). ``expected`` is what the score is now (rounded half up).
    """

    outcomes: int
    successes: int
    success: Decimal | None
    uptime: Decimal
    latency: Decimal
    latency_model: str
    computed: Decimal
    weight: Decimal
    expected: int


def device_score_parts(*, device: Device, now: datetime) -> ScoreParts:
    """The score's parts for the device now, from the inputs its stored score is
    computed from (``hosts.services.device_score_inputs``)."""
    inputs = device_score_inputs(device_id=device.id, now=now)
    n = inputs.outcomes
    success, uptime, latency = score_parts(
        outcomes=n,
        successes=inputs.successes,
        online_fraction=inputs.online,
        model_median_ttft_ms=inputs.model_median,
        device_ttft_ms=inputs.device_median,
    )
    return ScoreParts(
        outcomes=n,
        successes=inputs.successes,
        success=success if n else None,
        uptime=uptime,
        latency=latency,
        latency_model=inputs.model_id,
        computed=success + uptime + latency if n else PRIOR,
        weight=Decimal(min(n, WINDOW)) / WINDOW,
        expected=inputs.score,
    )


@dataclass
class DeviceView:
    """A device on the machine page, with what the page shows about it.

    Passed spot checks are not listed (nor counted): a pass at a known time
    would tell the host which of its jobs was a check (DESIGN.md "Spot
    checks"); staff see every check in the admin. ``failed_checks``: its failed
    spot checks, newest first (a failure has consequences the host is told
    of); ``passes_in_a_row``: passed checks since the last failure, shown while
    quarantined (when every job it gets is a check). ``vram_used_pct`` and
    ``temp_pct`` (0–100, of the total VRAM and of ``BALLAST_MAX_GPU_TEMP_C``)
    draw the live gauges; ``hot``: at or over that limit (no new jobs).
    ``unchecked_models``: the models it runs the catalog's weights of that have
    no calibrated spot check yet (``hosts.checkpools``); ``checks_never``: all
    of them, so no check is sent to it (nor can it leave a quarantine).
    """

    device: Device
    loaded_models: list[str]
    parts: ScoreParts | None = None
    failed_checks: list[DeviceOutcome] = field(default_factory=list)
    passes_in_a_row: int = 0
    weights_why: dict[str, str] = field(default_factory=dict)
    unchecked_models: list[str] = field(default_factory=list)
    checks_never: bool = False

    @property
    def loaded_with_why(self) -> list[tuple[str, str]]:
        """Its loaded models, each with why it gets no work of it ('' when it
        runs the catalog's weights: ``CatalogModel.weights_refusal``)."""
        return [(m, self.weights_why.get(m, "")) for m in self.loaded_models]

    @property
    def vram_used_pct(self) -> int | None:
        d = self.device
        if d.vram_free_mb is None or not d.vram_total_mb:
            return None
        used = max(0, d.vram_total_mb - d.vram_free_mb)
        return min(100, round(100 * used / d.vram_total_mb))

    @property
    def vram_used_mb(self) -> int | None:
        d = self.device
        if d.vram_free_mb is None:
            return None
        return max(0, d.vram_total_mb - d.vram_free_mb)

    @property
    def memory_label(self) -> str:
        """Its declared memory as the page shows it: ``"24 GB VRAM"``, or
        ``"24 GB memory"`` for a CPU (its system memory; GB of 1024 MiB)."""
        gb = f"{self.device.vram_total_mb / 1024:.1f}".removesuffix(".0")
        what = "memory" if self.device.kind == Device.Kind.CPU else "VRAM"
        return f"{gb} GB {what}"

    @property
    def measured(self) -> list[DeviceModel]:
        """Its device-model rows with measurements (``measured_jobs`` > 0),
        by model id: each row's ``measured_tokens_per_s``, ``measured_like``
        and ``placement_verdict()`` are what the page lists it as."""
        rows = [dm for dm in self.device.models.all() if dm.measured_jobs]
        return sorted(rows, key=lambda dm: dm.model_id)

    @property
    def temp_pct(self) -> int | None:
        if self.device.temp_c is None:
            return None
        limit = settings.BALLAST_MAX_GPU_TEMP_C
        return max(0, min(100, round(100 * self.device.temp_c / limit)))

    @property
    def hot(self) -> bool:
        temp = self.device.temp_c
        return temp is not None and temp >= settings.BALLAST_MAX_GPU_TEMP_C


def device_views(
    *, machine: Machine, now: datetime, parts: bool = True, failed_checks: int = 20
) -> list[DeviceView]:
    """The machine's devices (retired ones last) with loaded models and, when
    ``parts``, score parts and failed spot checks (the live fragment needs
    neither)."""
    views = []
    catalog = {model.id: model for model in CatalogModel.objects.all()}
    devices = machine.devices.prefetch_related("models").order_by(
        F("retired_at").asc(nulls_first=True), "index"
    )
    for device in devices:
        recent = spot_checks_recent(device_id=device.id) if parts else []
        weights_why = {
            dm.model_id: catalog[dm.model_id].weights_refusal(
                dm.weights_sha256, dm.weights_quantization
            )
            for dm in device.models.all()
            if dm.loaded and dm.model_id in catalog
        }
        runnable = [model_id for model_id, why in weights_why.items() if not why]
        unchecked = models_unchecked(runnable) if parts else []
        views.append(
            DeviceView(
                device=device,
                loaded_models=sorted(
                    dm.model_id for dm in device.models.all() if dm.loaded
                ),
                weights_why=weights_why,
                unchecked_models=unchecked,
                checks_never=bool(unchecked) and len(unchecked) == len(runnable),
                parts=device_score_parts(device=device, now=now) if parts else None,
                failed_checks=list(
                    DeviceOutcome.objects.filter(
                        device=device,
                        source=DeviceOutcome.Source.SPOT_CHECK,
                        success=False,
                    )[:failed_checks]
                )
                if parts
                else [],
                passes_in_a_row=next(
                    (i for i, passed in enumerate(recent) if not passed), len(recent)
                ),
            )
        )
    return views


def machine_attempts(*, machine: Machine, limit: int = 25) -> list:
    """The machine's most recent attempts (``jobs``' rows, read through each
    device's ``attempts``), newest first, with their job, device, earning and
    receipt check, each with ``why_nothing``: why it earned nothing
    (``hosts.segments.segment_earned_nothing``), or None."""
    attempts = [
        attempt
        for device in machine.devices.all()
        for attempt in device.attempts.select_related(
            "job", "device__machine", "earning", "receipt_check"
        ).order_by("-offered_at")[:limit]
    ]
    attempts.sort(key=lambda attempt: attempt.offered_at, reverse=True)
    attempts = attempts[:limit]
    for attempt in attempts:
        attempt.why_nothing = segment_earned_nothing(attempt)
    return attempts


def machine_rentals(*, machine: Machine, limit: int = 10) -> list:
    """The latest rentals of the machine's devices (``jobs``' rows, read through
    each device's ``rentals``), newest first, with their device and ``earned``:
    the owner's earnings from each, nano-USD. Their ``status`` and
    ``stop_reason`` say why one ended early (a failed spot check, its device
    away too long: ``jobs.rentals.rentals_watch``)."""
    rentals = [
        rental
        for device in machine.devices.all()
        for rental in device.rentals.select_related("device__machine").order_by(
            "-created_at"
        )[:limit]
    ]
    rentals.sort(key=lambda rental: rental.created_at, reverse=True)
    rentals = rentals[:limit]
    earned = dict(
        Earning.objects.filter(rental_id__in=[r.id for r in rentals])
        .values_list("rental_id")
        .annotate(total=Sum("amount_nano"))
    )
    for rental in rentals:
        rental.earned = earned.get(rental.id, 0)
    return rentals


@dataclass
class BenchmarkRow:
    """A benchmark on this hardware beside the catalog's VRAM estimate (MiB)."""

    benchmark: Benchmark
    catalog_vram_estimate_mb: int | None


def machine_benchmarks(*, machine: Machine, limit: int = 20) -> list[BenchmarkRow]:
    """Recent benchmarks of the machine's devices, each with the catalog's estimate."""
    benchmarks = list(
        Benchmark.objects.filter(device__machine=machine).select_related("device")[
            :limit
        ]
    )
    estimates = dict(
        CatalogModel.objects.filter(
            id__in={b.model_id for b in benchmarks}
        ).values_list("id", "vram_per_request_mb")
    )
    return [BenchmarkRow(b, estimates.get(b.model_id)) for b in benchmarks]


def machine_earnings_daily(
    *, machine: Machine, now: datetime, days: int = 14
) -> list[tuple]:
    """Per day of the last ``days`` (oldest first): (date, nano-USD earned, not reversed)."""
    start = (now - timedelta(days=days - 1)).date()
    rows = (
        Earning.objects.filter(device__machine=machine, created_at__date__gte=start)
        .exclude(status=Earning.Status.REVERSED)
        .annotate(day=TruncDate("created_at"))
        .values("day")
        .annotate(total=Sum("amount_nano"))
    )
    totals = {row["day"]: row["total"] or 0 for row in rows}
    return [
        (start + timedelta(days=i), totals.get(start + timedelta(days=i), 0))
        for i in range(days)
    ]


SCORE_HISTORY = timedelta(days=7)  # what the machine page's score chart spans


def machine_score_history(*, machine: Machine, now: datetime) -> dict:
    """Map device label → [(taken_at, score)] over the last ``SCORE_HISTORY``,
    oldest first."""
    samples = ScoreSample.objects.filter(
        device__machine=machine, taken_at__gte=now - SCORE_HISTORY
    ).select_related("device", "device__machine")
    history: dict[str, list] = {}
    for sample in samples:
        history.setdefault(sample.device.label, []).append(
            (sample.taken_at, sample.score)
        )
    return history


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
