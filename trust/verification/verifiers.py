"""Who verifies an answer (``verification_open`` stores the round), whether its
scores can cover the answer, and what it is paid (DESIGN.md "Verifying real answers"; ``trust.verification.records``
calls these in its transactions)."""

from __future__ import annotations

import secrets
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.db.models import QuerySet
from django.db.models.expressions import RawSQL

from ballast.rows import columns, instances
from billing.models import ReceiptCheck
from billing.services import Segment, charge_plan, charge_post
from catalog.models import CatalogModel
from hosts.liveness import live_sql
from hosts.models import Device, Machine
from jobs.formats import response_format_of
from jobs.models import Attempt, Job, Rental, Verification
from jobs.selectors import features_sql, model_loaded_sql
from jobs.tokens import token_count_inflated

from .answers import VerifiedAnswer
from .checks import trusted

# verifiers considered for one pick (the best scores first, then one at random)
VERIFIERS_CONSIDERED = 64
PAIRS_REMEMBERED = 8
"""Verification rounds of one host owner's answers whose verifiers' owners
are not drawn again for it while others qualify (``_owners_fresh``)."""
WEIGHT_AGE_DAYS = 30
"""Days of a verifier's age that add to its weight (``verifier_weight``)."""
WEIGHT_PASSES = 30
"""Checks passed in a row that add to a verifier's weight."""


def verifier_pick(
    *,
    model_id: str,
    exclude_owners,
    now: datetime,
    trusted_only: bool = False,
    host_owner_id: int | None = None,
    features: tuple[str, ...] = (),
    among: QuerySet[Device] | None = None,
) -> Device | None:
    """A device to verify an answer of ``model_id``: live, in its machine's
    latest ``hello``, the model loaded from the weights its catalog entry
    pins (``jobs.selectors.model_loaded``), its machine declaring ``verifies``,
    not paused, quarantined or retired, not rented (a rental's device is its
    renter's), on a machine of none of ``exclude_owners`` (user ids), with
    ``trusted_only`` one that passed its checks (``checks.trusted``), with
    ``among`` one of those devices (a calibration sample's: trusted ones,
    ``calibration``), its
    machine declaring every one of ``features`` (the answer's constraint: a
    verifier scores under the grammar it was drawn under), with a
    slot (a device that takes jobs, so spot checks reach it too). Among the
    ``VERIFIERS_CONSIDERED`` best scored, the owners that verified an answer
    of ``host_owner_id``'s least recently (``_owners_fresh``: a recurring
    verifier–host pair is broken while others are available), then an owner
    drawn with ``secrets`` weighted by its best device's ``verifier_weight``
    (many devices buy no more say), then one of its devices by the same
    weight; devices not scoring a verification already first; None when no
    device qualifies."""
    passes = settings.BALLAST_VERIFIER_TRUST_PASSES if trusted_only else 0
    candidates = _candidates(
        model_id=model_id,
        now=now,
        passes=passes,
        exclude_owners=list(exclude_owners),
        features=features,
        among=among,
    )
    # one scoring already is busy (and offered no job meanwhile: a spot check
    # waits behind its queue): the idle ones first (fresh-eyes review 3)
    candidates = [d for d in candidates if not d.scoring] or candidates
    if not candidates:
        return None
    by_owner: dict[int, list[Device]] = {}
    for device in candidates:
        by_owner.setdefault(device.machine.owner_id, []).append(device)
    owners = _owners_fresh(sorted(by_owner), host_owner_id)
    weights = {
        owner: [verifier_weight(device, now) for device in by_owner[owner]]
        for owner in owners
    }
    owner = _weighted_choice(owners, [max(weights[o]) for o in owners])
    return _weighted_choice(by_owner[owner], weights[owner])


def verifiers_eligible(
    *, model: CatalogModel, now: datetime, passes: int = 0
) -> QuerySet[Device]:
    """The devices that may verify an answer of ``model`` now, of any owner
    (``verifier_pick``'s conditions but the owners): live, the model loaded
    from its pinned weights, the machine declaring ``verifies``, at least
    ``passes`` checks of verifiers passed, taking jobs, not paused,
    quarantined, retired or rented (``_eligible_sql``, as a sub-select)."""
    where, params = _eligible_sql(now=now, passes=passes)
    return Device.objects.filter(
        id__in=RawSQL(f"SELECT d.id{where}", [model.id, *params])
    )


def _eligible_sql(*, now: datetime, passes: int) -> tuple[str, list]:
    """``FROM … WHERE …`` of the devices that may verify an answer of a
    catalog entry now (``verifiers_eligible``) over ``d`` the device, ``m``
    its machine and ``c`` the entry, whose id is the parameter before the
    returned ones; one text on PostgreSQL and SQLite."""
    live, live_params = live_sql(now, "m")  # rule 1 (hosts.liveness)
    sql = (
        " FROM hosts_device d JOIN hosts_machine m ON m.id = d.machine_id"
        " JOIN jobs_catalogmodel c ON c.id = %s"
        f" WHERE {live} AND {model_loaded_sql('d', 'c')}"  # the catalog's weights
        " AND d.verifier_passes >= %s"
        " AND d.slots_total > 0"  # a device that takes jobs (and spot checks)
        " AND d.retired_at IS NULL AND NOT d.quarantined AND NOT d.paused"
        " AND m.verifies AND NOT m.paused AND NOT m.host_paused"
        " AND m.retired_at IS NULL"
        " AND NOT EXISTS (SELECT 1 FROM jobs_rental r WHERE r.device_id = d.id"
        f" AND r.status IN ({', '.join(['%s'] * len(Rental.OPEN_STATUSES))}))"
    )
    return sql, [*live_params, passes, *Rental.OPEN_STATUSES]


_CANDIDATE = ((Device, "d"), (Machine, "m"))


def _candidates(
    *,
    model_id: str,
    now: datetime,
    passes: int,
    exclude_owners: list[int],
    features: tuple[str, ...],
    among: QuerySet[Device] | None,
) -> list[Device]:
    """The ``VERIFIERS_CONSIDERED`` best scored devices (``-score``, then id)
    that may verify an answer of ``model_id`` (``_eligible_sql``, at least
    ``passes`` checks passed), on a machine declaring every one of
    ``features`` and of none of ``exclude_owners``, with ``among`` one of
    those devices; each with its machine, ``scoring`` whether it scores an
    offered verification now. One fixed statement (``ballast.rows``; the
    text varies only with how many owners, features and ``among``)."""
    where, params = _eligible_sql(now=now, passes=passes)
    terms, extra = features_sql(features)
    if among is not None:  # a calibration sample's: compiled (not the hot path)
        among_sql, among_params = among.order_by().values("id").query.sql_with_params()
        terms.append(f"d.id IN ({among_sql})")
        extra += among_params
    if exclude_owners:
        terms.append(f"m.owner_id NOT IN ({', '.join(['%s'] * len(exclude_owners))})")
        extra += exclude_owners
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {columns(*_CANDIDATE)}, EXISTS (SELECT 1 FROM jobs_verification v"
            " WHERE v.verifier_id = d.id AND v.status = %s)"
            f"{where}{''.join(f' AND {term}' for term in terms)}"
            " ORDER BY d.score DESC, d.id LIMIT %s",
            [
                Verification.Status.OFFERED.value,
                model_id,
                *params,
                *extra,
                VERIFIERS_CONSIDERED,
            ],
        )
        rows = cursor.fetchall()
    candidates = []
    for row in rows:
        device, machine = instances(row[:-1], *_CANDIDATE)
        device.machine, device.scoring = machine, bool(row[-1])
        candidates.append(device)
    return candidates


def verifier_weight(device: Device, now: datetime) -> int:
    """How much say ``device`` has in the verifier draw (an integer >= 1):
    ``(1 + its age in days, at most WEIGHT_AGE_DAYS) × (1 + its checks passed
    as a verifier since its last failure or outvoting, at most
    WEIGHT_PASSES)``. A new account (a sybil made for the purpose) weighs 1
    beside an established verifier's hundreds."""
    age_days = max(0, (now - device.first_seen_at).days)
    return (1 + min(age_days, WEIGHT_AGE_DAYS)) * (
        1 + min(device.verifier_passes, WEIGHT_PASSES)
    )


def _owners_fresh(owners: list[int], host_owner_id: int | None) -> list[int]:
    """Of ``owners``, those that verified none of ``host_owner_id``'s last
    answers, going back as far as leaves any (the owners of the verifiers of
    its last ``PAIRS_REMEMBERED`` verification rounds, the latest first)."""
    if host_owner_id is None:
        return owners
    recent: list[int] = []
    with connection.cursor() as cursor:
        cursor.execute(_RECENT_OWNERS_SQL, [host_owner_id, PAIRS_REMEMBERED])
        rows = cursor.fetchall()
    for (owner,) in rows:
        if owner not in recent:
            recent.append(owner)
    for remembered in range(len(recent), 0, -1):
        fresh = [o for o in owners if o not in recent[:remembered]]
        if fresh:
            return fresh
    return owners


# the owners of the verifiers of an owner's latest verification rounds, the
# latest first (``_owners_fresh``)
_RECENT_OWNERS_SQL = (
    "SELECT vm.owner_id FROM jobs_verification v"
    " JOIN hosts_device hd ON hd.id = v.device_id"
    " JOIN hosts_machine hm ON hm.id = hd.machine_id"
    " JOIN hosts_device vd ON vd.id = v.verifier_id"
    " JOIN hosts_machine vm ON vm.id = vd.machine_id"
    " WHERE hm.owner_id = %s ORDER BY v.offered_at DESC LIMIT %s"
)


def _weighted_choice(items: list, weights: list[int]):
    """One of ``items`` drawn with ``secrets``, each as likely as its
    integer weight (>= 1)."""
    pick = secrets.randbelow(sum(weights))
    for item, weight in zip(items, weights):
        if pick < weight:
            return item
        pick -= weight
    raise AssertionError("unreachable: the draw is under the weights' sum")


def scores_cover_answer(
    *, n: int, answer: str, recount: int | None, token_ids: list[int] | None = None
) -> bool:
    """Whether ``n`` scored tokens can be the whole ``answer``: with the host's
    ``token_ids`` sent, exactly one per id; else at least one, not inflated
    (``jobs.tokens.token_count_inflated``), and with the model's tokenizer's
    ``recount`` not under it by more than ``max(2, 15 %)`` (the answer
    tokenized after the prompt may split at its start differently)."""
    if token_ids is not None:
        return n == len(token_ids) > 0
    if n < 1 or token_count_inflated(reported=n, text=answer, recount=recount):
        return False
    return recount is None or recount - n <= max(2, recount * 15 // 100)


def verifier_pay(
    ver: Verification, verified: VerifiedAnswer, *, tokens: int, now: datetime
) -> None:
    """Pay the verifier for the prefill of ``tokens`` scored tokens of
    ``verified`` (its receipt valid) like a job's segment: the host share of
    the answer's price for them, held 24 h, from ``platform_checks`` (the one
    charge path, ``billing.services.charge_post``, keyed ``verify:<id>``: paid
    once). Nobody is billed. Sets ``ver.paid_nano`` (the caller saves)."""
    segment = Segment(
        attempt_id=None,
        device_id=ver.verifier_id,
        host_id=ver.verifier.machine.owner_id,
        tokens_billed=tokens,
        output_chars=len(verified.answer),
        token_count_flagged=False,
        receipt_valid=True,
        verdict=ReceiptCheck.Verdict.VALID,
    )
    plan = charge_plan(segments=[segment], max_tokens=None, price=verified.price_nano)
    posted = charge_post(
        job_id=None,
        renter=None,
        model_id=verified.model_id,
        plan=plan,
        now=now,
        key=f"verify:{ver.id}",
        memo=f"verification: {plan.tokens} tokens of {verified.model_id} scored",
    )
    if posted is not None:
        ver.paid_nano = sum(share for _, share in plan.shares)


def verification_open(
    *,
    job: Job,
    attempt: Attempt,
    round: int,
    now: datetime,
    exclude_owners=(),
    among: QuerySet[Device] | None = None,
    verdict: str = "",
) -> Verification:
    """Store a verification of ``attempt`` (of ``job``) in ``round`` with a
    verifier picked among other owners' devices (``verifier_pick``: never the
    verified host's owner, nor any of ``exclude_owners``; from round 2 on a
    trusted verifier, ``checks.trusted``, while one qualifies; not one that
    recently verified that owner while others qualify; with ``among``, one of
    those devices); ``no_verifier`` when there is none. ``verdict``: the
    row's to begin with (``sample``: a calibration sample's,
    ``calibration.sample_open``)."""
    owner_id = attempt.device.machine.owner_id
    exclude = {owner_id, *exclude_owners}
    constraint = response_format_of(job.params or {})
    features = (constraint["type"],) if constraint else ()
    verifier = None
    if round >= 2:
        verifier = verifier_pick(
            model_id=job.model_id,
            exclude_owners=exclude,
            now=now,
            trusted_only=True,
            host_owner_id=owner_id,
            features=features,
            among=among,
        )
    verifier = verifier or verifier_pick(
        model_id=job.model_id,
        exclude_owners=exclude,
        now=now,
        host_owner_id=owner_id,
        features=features,
        among=among,
    )
    return Verification.objects.create(
        job=job,
        attempt=attempt,
        device_id=attempt.device_id,
        verifier=verifier,
        verifier_trusted=verifier is not None and trusted(verifier),
        round=round,
        verdict=verdict,
        status=Verification.Status.OFFERED
        if verifier
        else Verification.Status.NO_VERIFIER,
        offered_at=now,
    )
