"""Reads of the staff console: the fleet per model, a renter's, a machine's and
a device's whole picture. Amounts are nano-USD (pages show them in dollars),
times timezone-aware UTC, fractions 0..1."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db.models import Count, Q, QuerySet, Sum

from billing.models import Account, Earning
from billing.selectors import host_balances_nano, renter_balance_nano, renter_statement
from catalog.models import CatalogModel
from hosts.models import Device, DeviceOutcome, Machine, QuarantineDecision
from hosts.selectors import device_score_parts, earnings_by_machine, machine_status
from hosts.services import machine_spans, online_fraction
from jobs.models import ApiKey, Attempt, Job, Rental, SpotCheck, Verification
from jobs.selectors import devices_live, model_capacity
from support.models import Ticket
from trust.checkpools import CheckSupply, check_supply

from .words import outcome_words

HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class ModelFleet:
    """One catalog model across the fleet: live devices with it loaded
    (``devices_online``, of which ``quarantined``), their free and total slots,
    jobs ``queued`` and ``running``; over the last hour: ``attempts`` ended and
    ``failures`` among them (DESIGN.md's failures: missed claim or first
    token, host error, death mid-stream, stall), spot checks judged
    (``checks``, ``checks_failed``) and verifications scored
    (``verifications``, ``verifications_failed``: a failed verdict); now:
    what it has to check with (``supply``: ``trust.checkpools.CheckSupply``)."""

    model: CatalogModel
    devices_online: int
    quarantined: int
    slots_free: int
    slots_total: int
    queued: int
    running: int
    attempts: int
    failures: int
    checks: int
    checks_failed: int
    verifications: int
    verifications_failed: int
    supply: CheckSupply


def fleet_by_model(*, now: datetime) -> list[ModelFleet]:
    """Every active catalog model's ``ModelFleet`` now, by model id."""
    hour_ago = now - HOUR
    rows = []
    for model in CatalogModel.objects.filter(active=True).order_by("id"):
        live = devices_live(now=now).filter(
            models__model_id=model.id, models__loaded=True
        )
        totals = live.aggregate(
            quarantined=Count("id", filter=Q(quarantined=True), distinct=True),
            slots=Sum("slots_total"),
        )
        jobs = Job.objects.filter(model_id=model.id, status__in=Job.OPEN_STATUSES)
        open_counts = jobs.aggregate(
            queued=Count("id", filter=Q(status=Job.Status.QUEUED)),
            running=Count("id", filter=Q(status=Job.Status.RUNNING)),
        )
        attempts = Attempt.objects.filter(
            job__model_id=model.id, ended_at__gte=hour_ago
        ).aggregate(
            ended=Count("id"),
            failed=Count("id", filter=Q(outcome__in=Attempt.FAILURES)),
        )
        checks = (
            SpotCheck.objects.filter(job__model_id=model.id, judged_at__gte=hour_ago)
            .exclude(reason=SpotCheck.Reason.CALIBRATION)  # votes, not verdicts
            .aggregate(judged=Count("id"), failed=Count("id", filter=Q(passed=False)))
        )
        verifications = Verification.objects.filter(
            job__model_id=model.id, scored_at__gte=hour_ago
        ).aggregate(
            scored=Count("id"),
            failed=Count("id", filter=Q(verdict=Verification.Verdict.FAILED)),
        )
        capacity = model_capacity(model_id=model.id, now=now)
        rows.append(
            ModelFleet(
                model=model,
                devices_online=capacity["devices_online"],
                quarantined=totals["quarantined"] or 0,
                slots_free=capacity["slots_free"],
                slots_total=totals["slots"] or 0,
                queued=open_counts["queued"],
                running=open_counts["running"],
                attempts=attempts["ended"],
                failures=attempts["failed"],
                checks=checks["judged"],
                checks_failed=checks["failed"],
                verifications=verifications["scored"],
                verifications_failed=verifications["failed"],
                supply=check_supply(model=model, now=now),
            )
        )
    return rows


def people_find(*, text: str, limit: int = 20) -> QuerySet:
    """Users whose email or username contains ``text`` (case-insensitive)."""
    text = text.strip()
    if not text:
        return get_user_model().objects.none()
    return get_user_model().objects.filter(
        Q(email__icontains=text) | Q(username__icontains=text)
    ).order_by("email")[:limit]


def machines_find(*, text: str, limit: int = 20) -> QuerySet[Machine]:
    """Machines whose name, owner's email or id starts/contains ``text``."""
    text = text.strip()
    if not text:
        return Machine.objects.none()
    return (
        Machine.objects.filter(
            Q(name__icontains=text)
            | Q(owner__email__icontains=text)
            | Q(id__startswith=text.lower())
        )
        .select_related("owner")
        .order_by("name")[:limit]
    )


@dataclass
class KeyLine:
    """An API key with what it spent in its cap's period (nano-USD)."""

    key: ApiKey
    spent_nano: int


@dataclass
class RenterPicture:
    """What staff need to answer a renter: ``balance_nano``; ``keys`` with their
    caps and spend; the latest ``jobs`` (attempts and devices loaded) and how
    many in all; ``entries``: the credit account's ledger lines, newest first;
    ``tickets``, ``rentals``; the user's machines, if they host too, with
    ``host_balances`` (``billing.selectors.host_balances_nano``)."""

    user: object
    balance_nano: int
    keys: list[KeyLine]
    jobs: list[Job]
    job_count: int
    spent_nano: int
    entries: list
    tickets: list[Ticket]
    rentals: list[Rental]
    machines: list[Machine]
    credit_account_id: int | None
    host_balances: dict[str, int] = field(default_factory=dict)


def renter_picture(*, user, now: datetime, jobs: int = 30) -> RenterPicture:
    """The ``RenterPicture`` of ``user`` now (its latest ``jobs`` jobs)."""
    own_jobs = Job.objects.filter(renter=user, is_spot_check=False)
    machines = list(Machine.objects.filter(owner=user).order_by("name"))
    return RenterPicture(
        user=user,
        balance_nano=renter_balance_nano(user=user),
        keys=[
            KeyLine(key, key.spent_in_period_nano(now))
            for key in ApiKey.objects.filter(user=user).order_by(
                "revoked_at", "-created_at"
            )
        ],
        jobs=list(
            own_jobs.select_related("api_key")
            .prefetch_related("attempts__device__machine")
            .order_by("-created_at")[:jobs]
        ),
        job_count=own_jobs.count(),
        spent_nano=own_jobs.aggregate(total=Sum("cost_nano"))["total"] or 0,
        entries=list(renter_statement(user=user, limit=50)),
        tickets=list(
            Ticket.objects.filter(author=user)
            .annotate(message_count=Count("messages"))
            .order_by("-created_at")[:20]
        ),
        rentals=list(
            Rental.objects.filter(renter=user)
            .select_related("device__machine")
            .order_by("-created_at")[:20]
        ),
        machines=machines,
        credit_account_id=Account.objects.filter(
            kind=Account.Kind.RENTER_CREDIT, user=user
        )
        .values_list("id", flat=True)
        .first(),
        host_balances=host_balances_nano(user=user) if machines else {},
    )


@dataclass(frozen=True)
class OutcomeLine:
    """An outcome with its reason in words (``staff.words.outcome_words``)."""

    outcome: DeviceOutcome
    words: str


def outcome_lines(outcomes) -> list[OutcomeLine]:
    return [OutcomeLine(o, outcome_words(o)) for o in outcomes]


def uptime(*, machine: Machine, now: datetime, days: int) -> Decimal:
    """The fraction (0..1) of the last ``days`` days (or since it was registered,
    if later) that ``machine`` was online (``hosts.services.online_fraction``)."""
    start = max(now - timedelta(days=days), machine.created_at)
    spans, latest = machine_spans(machine_id=machine.id, start=start)
    return online_fraction(
        machine=machine, start=start, spans=spans, latest=latest, now=now
    )


@dataclass
class MachinePicture:
    """A machine as staff see it: ``status`` (``hosts.selectors.machine_status``),
    ``seen_until`` (its last proof of life), uptime over 24 h and 7 days,
    ``earnings`` (held and available of its devices), ``reversed_nano``,
    ``devices``, the latest ``outcomes`` of all its devices with their reason
    in words, its failed capabilities and rentals."""

    machine: Machine
    status: str
    seen_until: datetime | None
    uptime_day: Decimal
    uptime_week: Decimal
    earnings: object
    reversed_nano: int
    devices: list[Device]
    outcomes: list[OutcomeLine]
    failed_capabilities: list
    rentals: list[Rental]


def machine_picture(*, machine: Machine, now: datetime) -> MachinePicture:
    devices = list(machine.devices.order_by("retired_at", "index"))
    return MachinePicture(
        machine=machine,
        status=machine_status(machine, now),
        seen_until=machine.seen_until(),
        uptime_day=uptime(machine=machine, now=now, days=1),
        uptime_week=uptime(machine=machine, now=now, days=7),
        earnings=earnings_by_machine(machines=[machine])[machine.id],
        reversed_nano=Earning.objects.filter(
            device__machine=machine, status=Earning.Status.REVERSED
        ).aggregate(total=Sum("amount_nano"))["total"]
        or 0,
        devices=devices,
        outcomes=outcome_lines(
            DeviceOutcome.objects.filter(device__machine=machine).select_related(
                "device__machine"
            )[:30]
        ),
        failed_capabilities=list(machine.failed_capabilities.order_by("-last_at")),
        rentals=list(
            Rental.objects.filter(device__machine=machine)
            .select_related("renter", "device__machine")
            .order_by("-created_at")[:10]
        ),
    )


@dataclass
class DevicePicture:
    """A device as staff see it: score parts, its latest ``outcomes`` (reason in
    words, job), spot checks (every one, passed ones too: staff only),
    verifications of its answers (``verified``) and by it (``verifying``),
    earnings per status (nano-USD) and the latest ones, staff's quarantine
    decisions."""

    device: Device
    parts: object
    outcomes: list[OutcomeLine]
    checks: list[SpotCheck]
    verified: list[Verification]
    verifying: list[Verification]
    earning_totals: dict[str, int]
    earnings: list[Earning]
    decisions: list[QuarantineDecision]


def device_picture(*, device: Device, now: datetime) -> DevicePicture:
    totals = dict(
        Earning.objects.filter(device=device)
        .values_list("status")
        .annotate(total=Sum("amount_nano"))
    )
    return DevicePicture(
        device=device,
        parts=device_score_parts(device=device, now=now),
        outcomes=outcome_lines(device.outcomes.select_related("device__machine")[:50]),
        checks=list(
            SpotCheck.objects.filter(device=device).select_related("canary")[:30]
        ),
        verified=list(
            Verification.objects.filter(device=device)
            .select_related("verifier__machine")
            .order_by("-offered_at")[:20]
        ),
        verifying=list(
            Verification.objects.filter(verifier=device)
            .select_related("device__machine")
            .order_by("-offered_at")[:20]
        ),
        earning_totals={s: totals.get(s, 0) for s in Earning.Status.values},
        earnings=list(
            Earning.objects.filter(device=device)
            .select_related("attempt")
            .order_by("-created_at")[:20]
        ),
        decisions=list(
            QuarantineDecision.objects.filter(device=device).select_related("staff")
        ),
    )
