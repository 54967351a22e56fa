"""Charges: what a finished job delivered, and a rental's time (DESIGN.md "Money").

A charge debits the renter's credit, credits each paid host's hold (an
``Earning`` released after ``BALLAST_HOLD_HOURS``) with ``BALLAST_HOST_SHARE`` of
its part, and gives the platform the rest: one balanced transaction per job or
rental period. Amounts are integer nano-USD.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from ..models import Account, Earning, LedgerTransaction, ReceiptCheck
from ..money import share_of
from .ledger import account_for, accounts_for, ledger_post


@dataclass
class Segment:
    """What the charge needs of one attempt of a job (DESIGN.md "Money").

    ``attempt_id`` (UUID or str), ``device_id`` the device that ran it,
    ``host_id`` the user id of its machine's owner; ``tokens_billed`` its billed
    output tokens (≤ ``output_chars``, the characters it delivered, after
    ``charge_plan``); ``token_count_flagged`` whether its count was not believed;
    ``receipt_valid`` and ``verdict`` its receipt's (``ReceiptCheck.Verdict``,
    None without a receipt check).
    """

    attempt_id: object
    device_id: int
    host_id: int
    tokens_billed: int
    output_chars: int
    token_count_flagged: bool
    receipt_valid: bool | None
    verdict: str | None

    @property
    def paid(self) -> bool:
        """True when this segment's host is paid: a valid receipt and a believable count."""
        return self.unpaid_reason is None

    @property
    def unpaid_reason(self) -> str | None:
        """Why this segment's host is not paid, in words for the host, or None
        when it is (DESIGN.md "Money": only against a valid receipt, a believable
        count, and tokens the renter received)."""
        if self.tokens_billed <= 0:
            return "no tokens billed: the renter received none of this segment"
        if self.verdict is None:
            return "no receipt came for this segment"
        if self.verdict == ReceiptCheck.Verdict.MISSING:
            return "no receipt: the agent sent none with its answer"
        if self.verdict == ReceiptCheck.Verdict.REPLAYED:
            return "the receipt repeated one already used"
        if self.verdict != ReceiptCheck.Verdict.VALID or self.receipt_valid is not True:
            return "the receipt did not verify (signature, or hash of the text sent)"
        if self.token_count_flagged:
            return "the reported token count was not believable (flagged)"
        return None


def segment_of(attempt) -> Segment:
    """The ``Segment`` of an ended attempt (``jobs.Attempt``, with its device,
    machine and receipt check loaded): what billing needs of it."""
    try:
        verdict = attempt.receipt_check.verdict
    except ReceiptCheck.DoesNotExist:
        verdict = None
    return Segment(
        attempt_id=attempt.id,
        device_id=attempt.device_id,
        host_id=attempt.device.machine.owner_id,
        tokens_billed=attempt.tokens_billed,
        output_chars=attempt.output_chars,
        token_count_flagged=attempt.token_count_flagged,
        receipt_valid=attempt.receipt_valid,
        verdict=verdict,
    )


@dataclass
class ChargePlan:
    """A job's charge, computed by ``charge_plan``: ``tokens`` billed in all,
    ``cost`` nano-USD, ``capped`` segments whose count was cut (write them back),
    ``shares`` (segment, nano-USD) of the paid hosts, ``platform`` the rest."""

    tokens: int
    cost: int
    capped: list[Segment] = field(default_factory=list)
    shares: list[tuple[Segment, int]] = field(default_factory=list)
    platform: int = 0


def charge_plan(
    *, segments: list[Segment], max_tokens: int | None, price: int
) -> ChargePlan:
    """Apply the token sanity rules to ``segments`` (in offer order) and split the cost.

    A segment's billed tokens never exceed the characters it delivered, and the
    job's never exceed ``max_tokens`` (the excess is cut from the last segments);
    a cut segment is flagged (changed in place, listed in ``capped``). Cost =
    tokens × ``price`` (nano-USD per token); each paid segment's host gets
    ``BALLAST_HOST_SHARE`` of its part (rounded down), the platform the rest.
    Pure: writes nothing.
    """
    capped: dict[int, Segment] = {}
    tokens_total = 0
    for segment in segments:
        if segment.tokens_billed > segment.output_chars:
            segment.tokens_billed = segment.output_chars
            segment.token_count_flagged = True
            capped[id(segment)] = segment
        tokens_total += segment.tokens_billed
    # never more than the renter's max_tokens, whatever a host sent: the excess is
    # trimmed from the last segments (and flagged there)
    excess = tokens_total - (max_tokens or tokens_total)
    for segment in reversed(segments):
        if excess <= 0:
            break
        cut = min(excess, segment.tokens_billed)
        if cut:
            segment.tokens_billed -= cut
            segment.token_count_flagged = True
            capped[id(segment)] = segment
            excess -= cut
            tokens_total -= cut
    cost = tokens_total * price
    plan = ChargePlan(tokens=tokens_total, cost=cost, capped=list(capped.values()))
    if cost <= 0:
        return plan
    for segment in segments:
        if not segment.paid:
            continue
        share = share_of(segment.tokens_billed * price, settings.BALLAST_HOST_SHARE)
        if share > 0:
            plan.shares.append((segment, share))
    plan.platform = cost - sum(share for _, share in plan.shares)
    return plan


@transaction.atomic(savepoint=False)  # inside a job's end: no savepoint of its own
def charge_post(
    *,
    job_id,
    renter: AbstractBaseUser | None,
    model_id: str,
    plan: ChargePlan,
    now: datetime,
    key: str = "",
    memo: str = "",
) -> LedgerTransaction | None:
    """Post ``plan`` as the charge of job ``job_id`` (UUID or str) to ``renter``
    (the job's renter, a user; None for a spot check, which the platform pays);
    return the transaction, or None when nothing was posted.

    One transaction, key ``charge:<job_id>`` (or ``key``: the prefill of a
    verification, paid by the platform like a spot check, ``job_id`` None),
    memo "<tokens> tokens of <model_id>" (or ``memo``): the renter's credit −``plan.cost``, each paid segment's host's
    ``host_held`` +its share with an ``Earning`` (held until ``now`` +
    ``BALLAST_HOLD_HOURS``), the platform the rest; zero legs are dropped. A
    spot check's hosts are paid the same shares, from ``platform_checks``
    (−their sum), so their earnings read as any job's and nobody is billed
    (DESIGN.md "Spot checks"). Nothing is posted when ``plan.cost`` ≤ 0 (or a
    spot check pays no host), or when the job was charged before (once per job,
    whoever retries or races). Raises UnbalancedTransaction for a plan whose
    parts do not sum to its cost.
    """
    if plan.cost <= 0:
        return None
    paid = sum(share for _, share in plan.shares)
    if renter is None and paid <= 0:
        return None
    if renter is None:
        wanted = [((Account.Kind.PLATFORM_CHECKS, None), -paid)]
    else:
        wanted = [((Account.Kind.RENTER_CREDIT, renter.pk), -plan.cost)]
    wanted += [
        ((Account.Kind.HOST_HELD, segment.host_id), share)
        for segment, share in plan.shares
    ]
    if renter is not None:
        wanted.append(((Account.Kind.PLATFORM, None), plan.platform))
    accounts = accounts_for([account for account, _ in wanted])  # one read
    legs = [(account, amount) for account, (_, amount) in zip(accounts, wanted)]
    release_at = now + timedelta(hours=settings.BALLAST_HOLD_HOURS)
    earnings = [
        Earning(
            attempt_id=segment.attempt_id,
            device_id=segment.device_id,
            host_id=segment.host_id,
            amount_nano=share,
            release_at=release_at,
        )
        for segment, share in plan.shares
    ]
    return ledger_post(  # the earnings stored with it (one statement on PostgreSQL)
        kind=LedgerTransaction.Kind.CHARGE,
        key=key or f"charge:{job_id}",
        legs=legs,
        job_id=job_id,
        memo=memo or f"{plan.tokens} tokens of {model_id}",
        stored_with=earnings,
    )


@transaction.atomic
def rental_charge(
    *,
    rental,
    amount_nano: int,
    since: datetime,
    upto: datetime,
    now: datetime | None = None,
) -> LedgerTransaction | None:
    """Charge a renter ``amount_nano`` (> 0) for rental time from ``since`` to
    ``upto``; credit the host.

    ``rental``: the rental (its ``id``, ``renter``, ``device`` and the device's
    ``machine.owner`` are read). One balanced transaction keyed by the period it
    covers (``rental:<id>:<since>/<upto>``, ISO 8601): renter −amount, the device owner's hold +its
    ``BALLAST_HOST_SHARE`` (an ``Earning`` like any segment's, reversible by a
    failed spot check until released), the platform the rest. Returns the
    transaction, or None when that period was charged before. Raises ValueError
    for an amount that is not positive.
    """
    if amount_nano <= 0:
        raise ValueError("a rental charge must be positive")
    now = now or timezone.now()
    host = rental.device.machine.owner
    share = share_of(amount_nano, settings.BALLAST_HOST_SHARE)
    txn = ledger_post(
        kind=LedgerTransaction.Kind.RENTAL,
        key=f"rental:{rental.id}:{since.isoformat()}/{upto.isoformat()}",
        legs=[
            (
                account_for(kind=Account.Kind.RENTER_CREDIT, user=rental.renter),
                -amount_nano,
            ),
            (account_for(kind=Account.Kind.HOST_HELD, user=host), share),
            (account_for(kind=Account.Kind.PLATFORM), amount_nano - share),
        ],
        memo=f"rental of {rental.device} {since.isoformat()} to {upto.isoformat()}",
    )
    if txn is not None and share > 0:
        Earning.objects.create(
            rental=rental,
            device=rental.device,
            host=host,
            amount_nano=share,
            release_at=now + timedelta(hours=settings.BALLAST_HOLD_HOURS),
        )
    return txn
