"""Ledger writes: top-ups, receipts, job charges with host earnings, holds, payouts.

Every function that moves money writes one balanced transaction (entries sum to
zero) under a unique idempotency key, so a retry or a concurrent duplicate writes
nothing twice (DESIGN.md "Money"; the rules with worked numbers are in
docs/money.md). All amounts are integer nano-USD (``billing.money``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from ballast.db import db_datetime, db_uuid, row_fetch, rows_changed

from .models import (
    Account,
    Earning,
    Entry,
    LedgerTransaction,
    PayoutRequest,
    ReceiptCheck,
)
from .money import NANO_PER_USD, nano_to_usd_str, share_of
from .receipts import receipt_verify
from .selectors import account_balance_nano, host_balances_nano, renter_balance_nano

__all__ = [
    "PayoutError",
    "UnbalancedTransaction",
    "account_balance_nano",
    "account_for",
    "earnings_reverse_held",
    "holds_release",
    "job_charge",
    "ledger_post",
    "payout_approve",
    "payout_mark_paid",
    "payout_reject",
    "payout_request",
    "receipt_check",
    "renter_balance_nano",
    "renter_top_up",
]


class UnbalancedTransaction(ValueError):
    """The legs of a ledger transaction do not sum to zero."""


class PayoutError(ValueError):
    """A payout request or decision that the rules refuse (amount, status)."""


def account_for(*, kind: str, user: AbstractBaseUser | None = None) -> Account:
    """Return the ledger account of this kind (per user, or the system one).

    Created on first use; a concurrent first use is settled by the unique
    constraints on (kind, user).
    """
    account = Account.objects.filter(kind=kind, user=user).first()
    if account is not None:  # the usual case: one read, no savepoint
        return account
    try:
        with transaction.atomic():
            account, _ = Account.objects.get_or_create(kind=kind, user=user)
    except IntegrityError:
        account = Account.objects.get(kind=kind, user=user)
    return account


def ledger_post(
    *, kind: str, key: str, legs: list[tuple[Account, int]], job=None, memo: str = ""
) -> LedgerTransaction | None:
    """Write one balanced transaction; return it, or None if ``key`` was already posted.

    ``legs`` are (account, nano-USD) pairs, > 0 credits and < 0 debits; zero legs
    are dropped. Raises UnbalancedTransaction when the legs do not sum to zero
    (the database refuses such a transaction too: docs/money.md).
    """
    legs = [(account, amount) for account, amount in legs if amount]
    total = sum(amount for _, amount in legs)
    if total != 0 or not legs:
        raise UnbalancedTransaction(f"{kind} {key}: {len(legs)} legs sum to {total}")
    try:
        with transaction.atomic():
            txn = LedgerTransaction.objects.create(
                kind=kind, key=key, job=job, memo=memo[:300], leg_count=len(legs)
            )
            Entry.objects.bulk_create(
                [
                    Entry(transaction=txn, account=account, amount_nano=amount)
                    for account, amount in legs
                ]
            )
    except IntegrityError:
        if LedgerTransaction.objects.filter(key=key).exists():
            return None
        raise
    return txn


TOP_UP_MAX_NANO = 1_000_000 * NANO_PER_USD  # one million USD


@transaction.atomic
def renter_top_up(
    *, user: AbstractBaseUser, amount_nano: int, key: str
) -> LedgerTransaction | None:
    """Credit a renter with ``amount_nano`` (> 0, at most ``TOP_UP_MAX_NANO``)
    from the funding account.

    Idempotent on ``key``. Raises ValueError for an amount that is not positive
    or past the bound (which keeps every balance far inside the ledger's 64-bit
    integers: 9.2 billion USD in nano-USD).
    """
    if amount_nano <= 0:
        raise ValueError("a top-up must be positive")
    if amount_nano > TOP_UP_MAX_NANO:
        raise ValueError(
            f"a top-up must be at most {nano_to_usd_str(TOP_UP_MAX_NANO)} USD"
        )
    return ledger_post(
        kind=LedgerTransaction.Kind.TOP_UP,
        key=key,
        legs=[
            (account_for(kind=Account.Kind.FUNDING), -amount_nano),
            (account_for(kind=Account.Kind.RENTER_CREDIT, user=user), amount_nano),
        ],
        memo="credit top-up",
    )


# --- receipts ------------------------------------------------------------------------
@transaction.atomic(savepoint=False)  # inside a job's end: no savepoint of its own
def receipt_check(
    *,
    attempt,
    public_key_b64: str,
    signature_b64: str,
    completion_tokens: int,
    text: str,
) -> str:
    """Judge and record the receipt of an attempt's ``done``; return the verdict.

    ``valid`` only for an Ed25519 signature by the machine's pinned key over
    (attempt id, ``completion_tokens``, sha256 of ``text`` — the exact text relayed).
    ``missing`` with no signature, ``invalid`` for a bad signature or a text hash
    that does not match, ``replayed`` for a signature already presented (for
    another attempt, or a second ``done``). One ``ReceiptCheck`` per attempt: a
    second call for the same attempt returns the first verdict and changes nothing.
    """
    existing = ReceiptCheck.objects.filter(attempt_id=attempt.id).first()
    if existing is not None:
        return existing.verdict
    signature = (signature_b64 or "")[:200] or None
    verdict = receipt_verdict(
        signature=signature,
        replayed=signature is not None
        and ReceiptCheck.objects.filter(signature=signature).exists(),
        public_key_b64=public_key_b64,
        attempt_id=str(attempt.id),
        completion_tokens=completion_tokens,
        text=text,
    )
    stored = None if verdict == ReceiptCheck.Verdict.REPLAYED else signature
    try:
        with transaction.atomic():
            ReceiptCheck.objects.create(
                attempt_id=attempt.id,
                device_id=attempt.device_id,
                signature=stored,
                verdict=verdict,
            )
    except IntegrityError:
        existing = ReceiptCheck.objects.filter(attempt_id=attempt.id).first()
        if existing is not None:  # a concurrent second done of this attempt
            return existing.verdict
        verdict = ReceiptCheck.Verdict.REPLAYED  # the same signature, concurrently
        ReceiptCheck.objects.create(
            attempt_id=attempt.id,
            device_id=attempt.device_id,
            signature=None,
            verdict=verdict,
        )
    return verdict


def receipt_verdict(
    *,
    signature: str | None,
    replayed: bool,
    public_key_b64: str,
    attempt_id: str,
    completion_tokens: int,
    text: str,
) -> str:
    """The verdict on a receipt (pure): ``missing`` without a signature,
    ``replayed`` when ``replayed`` (the signature is already recorded), else
    ``valid`` or ``invalid`` by ``receipts.receipt_verify`` (PROTOCOL.md §2)."""
    if signature is None:
        return ReceiptCheck.Verdict.MISSING
    if replayed:
        return ReceiptCheck.Verdict.REPLAYED
    if receipt_verify(
        public_key_b64=public_key_b64,
        signature_b64=signature,
        job=attempt_id,
        completion_tokens=completion_tokens,
        text=text,
    ):
        return ReceiptCheck.Verdict.VALID
    return ReceiptCheck.Verdict.INVALID


def receipt_record(
    *, attempt_id, device_id: int, signature: str | None, verdict: str
) -> str:
    """Store the ``ReceiptCheck`` of an attempt judged by ``receipt_verdict``; return
    the verdict that stands. Fixed statements (``ballast.db``), no savepoint.

    The same outcomes as ``receipt_check``: a replayed signature is stored as
    NULL; if the attempt already has a check (a concurrent second ``done``), its
    verdict stands and nothing is written; if the signature was stored meanwhile
    by another attempt, this one is recorded ``replayed``.
    """
    stored = None if verdict == ReceiptCheck.Verdict.REPLAYED else signature
    params = [db_uuid(attempt_id), device_id, stored, verdict]
    if _receipt_insert(params):
        return verdict
    existing = row_fetch(
        "SELECT verdict FROM billing_receiptcheck WHERE attempt_id = %s",
        [params[0]],
    )
    if existing is not None:
        return existing[0]
    verdict = ReceiptCheck.Verdict.REPLAYED  # the same signature, concurrently
    _receipt_insert([params[0], device_id, None, verdict])
    return verdict


def _receipt_insert(params: list) -> bool:
    """INSERT a receipt check unless a unique key (attempt, signature) is taken."""
    return (
        row_fetch(
            "INSERT INTO billing_receiptcheck"
            " (attempt_id, device_id, signature, verdict, created_at)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING id",
            [*params, db_datetime(timezone.now())],
        )
        is not None
    )


# --- charges ---------------------------------------------------------------------------
@dataclass
class Segment:
    """What billing needs of one attempt of a job (DESIGN.md "Money").

    ``tokens_billed`` ≤ ``output_chars`` after ``charge_plan``; ``verdict`` is its
    receipt check's (None without one); ``host_id`` the owner of its machine and
    ``held_account_id`` that host's ``host_held`` account (None if not made yet).
    """

    attempt_id: object
    device_id: int
    host_id: int
    tokens_billed: int
    output_chars: int
    token_count_flagged: bool
    receipt_valid: bool | None
    verdict: str | None
    held_account_id: int | None = None

    @property
    def paid(self) -> bool:
        """True when this segment's host is paid: a valid receipt and a believable count."""
        return (
            self.verdict == ReceiptCheck.Verdict.VALID
            and self.receipt_valid is True
            and not self.token_count_flagged
            and self.tokens_billed > 0
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
    """Apply the token sanity rules to ``segments`` (in order) and split the cost.

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


def charge_post(
    *,
    job_id,
    model_id: str,
    plan: ChargePlan,
    renter_account_id: int,
    platform_account_id: int,
    now: datetime,
) -> int | None:
    """Post ``plan`` (cost > 0) as the job's charge; return the transaction id, or
    None if ``charge:<job id>`` was posted before (then nothing is written).

    What ``job_charge`` posts, as fixed statements (``ballast.db``): the ledger
    transaction, its entries (renter −cost, each paid segment's host hold +share,
    the platform the rest; zero legs dropped) and the held ``Earning`` of each
    paid segment (released after ``BALLAST_HOLD_HOURS``) — one statement on
    PostgreSQL (data-modifying CTEs; the balance check runs at commit), three on
    SQLite. Every segment of
    ``plan.shares`` must carry its ``held_account_id``. Raises
    UnbalancedTransaction for legs that do not sum to zero.
    """
    legs = [(renter_account_id, -plan.cost)]
    legs += [(segment.held_account_id, share) for segment, share in plan.shares]
    legs.append((platform_account_id, plan.platform))
    legs = [(account, amount) for account, amount in legs if amount]
    total = sum(amount for _, amount in legs)
    key = f"charge:{job_id}"
    if total != 0 or not legs:
        raise UnbalancedTransaction(f"charge {key}: {len(legs)} legs sum to {total}")
    created = db_datetime(timezone.now())  # auto_now_add: the real time
    txn_sql = (
        "INSERT INTO billing_ledgertransaction"
        " (kind, key, job_id, memo, leg_count, created_at)"
        " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (key) DO NOTHING RETURNING id"
    )
    txn_params = [
        LedgerTransaction.Kind.CHARGE,
        key,
        db_uuid(job_id),
        f"{plan.tokens} tokens of {model_id}"[:300],
        len(legs),
        created,
    ]
    entries = ", ".join(["(%s, %s)"] * len(legs))
    entry_params = [value for leg in legs for value in leg]
    earnings = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(plan.shares))
    release_at = db_datetime(now + timedelta(hours=settings.BALLAST_HOLD_HOURS))
    earning_params = [
        value
        for segment, share in plan.shares
        for value in (
            db_uuid(segment.attempt_id),
            segment.device_id,
            segment.host_id,
            share,
            Earning.Status.HELD,
            release_at,
            created,
        )
    ]
    earning_columns = (
        "(attempt_id, device_id, host_id, amount_nano, status, release_at, created_at)"
    )
    if connection.vendor == "postgresql":  # one statement: data-modifying CTEs
        sql = (
            f"WITH txn AS ({txn_sql}),"
            " entries AS (INSERT INTO billing_entry"
            " (transaction_id, account_id, amount_nano)"
            " SELECT txn.id, v.account, v.amount FROM txn,"
            f" (VALUES {entries}) AS v (account, amount))"
        )
        if plan.shares:
            sql += (
                f", earnings AS (INSERT INTO billing_earning {earning_columns}"
                " SELECT v.* FROM txn, (VALUES"
                f" {earnings}) AS v (attempt, device, host, amount, status, release, created))"
            )
        row = row_fetch(
            sql + " SELECT id FROM txn", [*txn_params, *entry_params, *earning_params]
        )
        return row[0] if row else None
    row = row_fetch(txn_sql, txn_params)
    if row is None:
        return None
    txn_id = row[0]
    rows_changed(
        "INSERT INTO billing_entry (transaction_id, account_id, amount_nano) VALUES "
        + ", ".join(["(%s, %s, %s)"] * len(legs)),
        [value for account, amount in legs for value in (txn_id, account, amount)],
    )
    if plan.shares:
        rows_changed(
            f"INSERT INTO billing_earning {earning_columns} VALUES {earnings}",
            earning_params,
        )
    return txn_id


@transaction.atomic
def job_charge(
    *, job, now: datetime | None = None, price_nano: int | None = None
) -> LedgerTransaction | None:
    """Charge the renter for what a finished job delivered; credit hosts' holds.

    Token sanity runs first: a segment's billed tokens never exceed the characters
    it delivered (a larger figure is capped and the attempt flagged), and the
    job's ``tokens_billed``/``cost_nano`` are set to the sum of its segments ×
    the model's completion price (nano-USD). Then one transaction (key
    ``charge:<job id>``): renter −cost; each paid segment's host +80 %
    (``BALLAST_HOST_SHARE``, rounded down per segment) into an ``Earning`` held
    ``BALLAST_HOLD_HOURS``; the platform the rest. A segment is paid only with a
    valid receipt and a believable token count. Spot checks, jobs without a
    renter and zero costs post nothing. ``price_nano``: the model's completion
    price per token when the caller has just read it. Returns None when nothing
    was posted (nothing to charge, or charged before). Raises ValueError for an
    open job.
    """
    from jobs.models import Attempt, CatalogModel, Job

    if job.status in Job.OPEN_STATUSES:
        raise ValueError(
            f"job {job.id} is still open; it is charged once, when it ends"
        )
    now = now or timezone.now()
    if job.is_spot_check or job.renter_id is None:
        if job.cost_nano:
            Job.objects.filter(id=job.id).update(cost_nano=0)
            job.cost_nano = 0
        return None
    price = (
        price_nano
        if price_nano is not None
        else CatalogModel.objects.get(id=job.model_id).price_completion_nano
    )
    attempts = list(
        job.attempts.select_related("device__machine__owner", "receipt_check").order_by(
            "offered_at", "id"
        )
    )
    segments = [
        Segment(
            attempt_id=attempt.id,
            device_id=attempt.device_id,
            host_id=attempt.device.machine.owner_id,
            tokens_billed=attempt.tokens_billed,
            output_chars=attempt.output_chars,
            token_count_flagged=attempt.token_count_flagged,
            receipt_valid=attempt.receipt_valid,
            verdict=getattr(getattr(attempt, "receipt_check", None), "verdict", None),
        )
        for attempt in attempts
    ]
    plan = charge_plan(
        segments=segments, max_tokens=job.params.get("max_tokens"), price=price
    )
    for segment in plan.capped:
        Attempt.objects.filter(id=segment.attempt_id).update(
            tokens_billed=segment.tokens_billed, token_count_flagged=True
        )
    tokens_total, cost = plan.tokens, plan.cost
    if (job.tokens_billed, job.cost_nano) != (tokens_total, cost):
        Job.objects.filter(id=job.id).update(tokens_billed=tokens_total, cost_nano=cost)
        job.tokens_billed, job.cost_nano = tokens_total, cost
    if cost <= 0:
        return None
    by_attempt = {attempt.id: attempt for attempt in attempts}
    legs: list[tuple[Account, int]] = [
        (account_for(kind=Account.Kind.RENTER_CREDIT, user=job.renter), -cost)
    ]
    earnings = []
    release_at = now + timedelta(hours=settings.BALLAST_HOLD_HOURS)
    for segment, share in plan.shares:
        attempt = by_attempt[segment.attempt_id]
        host = attempt.device.machine.owner
        legs.append((account_for(kind=Account.Kind.HOST_HELD, user=host), share))
        earnings.append(
            Earning(
                attempt=attempt,
                device=attempt.device,
                host=host,
                amount_nano=share,
                release_at=release_at,
            )
        )
    legs.append((account_for(kind=Account.Kind.PLATFORM), plan.platform))
    txn = ledger_post(
        kind=LedgerTransaction.Kind.CHARGE,
        key=f"charge:{job.id}",
        legs=legs,
        job=job,
        memo=f"{tokens_total} tokens of {job.model_id}",
    )
    if txn is not None:
        Earning.objects.bulk_create(earnings)
    return txn


@transaction.atomic
def rental_charge(
    *, rental, amount_nano: int, upto: datetime, now: datetime | None = None
):
    """Charge a renter ``amount_nano`` for rental time up to ``upto``; credit the host.

    One balanced transaction (key ``rental:<id>:<upto>``): renter −amount, the
    device owner's hold +80 % (an ``Earning`` like any segment's, reversible by a
    failed spot check until released), the platform the rest. Returns the
    transaction, or None when that period was charged before.
    """
    if amount_nano <= 0:
        raise ValueError("a rental charge must be positive")
    now = now or timezone.now()
    host = rental.device.machine.owner
    share = share_of(amount_nano, settings.BALLAST_HOST_SHARE)
    txn = ledger_post(
        kind=LedgerTransaction.Kind.RENTAL,
        key=f"rental:{rental.id}:{upto.isoformat()}",
        legs=[
            (
                account_for(kind=Account.Kind.RENTER_CREDIT, user=rental.renter),
                -amount_nano,
            ),
            (account_for(kind=Account.Kind.HOST_HELD, user=host), share),
            (account_for(kind=Account.Kind.PLATFORM), amount_nano - share),
        ],
        memo=f"rental of {rental.device} up to {upto.isoformat()}",
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


# --- holds -----------------------------------------------------------------------------
def _earning_settle(
    earning: Earning,
    *,
    status: str,
    kind: str,
    key: str,
    to_account: Account,
    memo: str,
    now: datetime,
) -> bool:
    """Move a held earning out of the hold (released or reversed), once.

    A compare-and-set on its status inside its own transaction, then one balanced
    ledger transaction from the host's held account to ``to_account``. Returns
    False when another worker settled it first.
    """
    with transaction.atomic():
        if not Earning.objects.filter(id=earning.id, status=Earning.Status.HELD).update(
            status=status, settled_at=now
        ):
            return False
        ledger_post(
            kind=kind,
            key=key,
            legs=[
                (
                    account_for(kind=Account.Kind.HOST_HELD, user=earning.host),
                    -earning.amount_nano,
                ),
                (to_account, earning.amount_nano),
            ],
            job=earning.attempt.job if earning.attempt_id else None,
            memo=memo[:300],
        )
    return True


def holds_release(*, now: datetime | None = None) -> int:
    """Move every earning whose hold has ended from held to available; return the count.

    Each earning is released in its own transaction by a compare-and-set on its
    status (and posted under key ``release:<earning id>``), so two workers never
    release one twice and one failure does not hold back the others.
    """
    now = now or timezone.now()
    released = 0
    due = Earning.objects.filter(status=Earning.Status.HELD, release_at__lte=now)
    for earning in due.select_related("host", "attempt__job"):
        released += _earning_settle(
            earning,
            status=Earning.Status.RELEASED,
            kind=LedgerTransaction.Kind.HOLD_RELEASE,
            key=f"release:{earning.id}",
            to_account=account_for(kind=Account.Kind.HOST_AVAILABLE, user=earning.host),
            memo=(
                f"hold ended for attempt {earning.attempt_id}"
                if earning.attempt_id
                else f"hold ended for rental {earning.rental_id}"
            ),
            now=now,
        )
    return released


def earnings_reverse_held(
    *, device_id: int, reason: str, now: datetime | None = None
) -> int:
    """Reverse every earning of the device still in its hold (a failed spot check).

    Each amount moves from the host's held account to the platform (key
    ``reversal:<earning id>``); released earnings are not touched. The renter's
    charge stands: they received the output. Returns how many were reversed.
    """
    now = now or timezone.now()
    reversed_count = 0
    held = Earning.objects.filter(device_id=device_id, status=Earning.Status.HELD)
    for earning in held.select_related("host", "attempt__job"):
        reversed_count += _earning_settle(
            earning,
            status=Earning.Status.REVERSED,
            kind=LedgerTransaction.Kind.EARNING_REVERSAL,
            key=f"reversal:{earning.id}",
            to_account=account_for(kind=Account.Kind.PLATFORM),
            memo=reason,
            now=now,
        )
    return reversed_count


# --- payouts -------------------------------------------------------------------------
def _host_available_locked(host: AbstractBaseUser) -> int:
    """Lock the host's available account row and return its balance (nano-USD)."""
    account = account_for(kind=Account.Kind.HOST_AVAILABLE, user=host)
    Account.objects.select_for_update().filter(id=account.id).first()
    return account_balance_nano(account)


@transaction.atomic
def payout_request(
    *, host: AbstractBaseUser, amount_nano: int, note: str = ""
) -> PayoutRequest:
    """Ask for ``amount_nano`` of the host's available earnings to be paid out.

    Allowed up to the available balance minus requests still waiting for staff.
    Raises PayoutError for an amount that is not positive or exceeds that.
    """
    if amount_nano <= 0:
        raise PayoutError("the amount must be positive")
    available = _host_available_locked(host)
    pending = host_balances_nano(user=host)["requested"]
    if amount_nano > available - pending:
        raise PayoutError(
            f"at most {nano_to_usd_str(max(0, available - pending))} USD can be requested now"
        )
    return PayoutRequest.objects.create(
        host=host, amount_nano=amount_nano, note=note[:300]
    )


@transaction.atomic
def payout_approve(
    *, payout_id: int, staff: AbstractBaseUser, now: datetime | None = None
) -> PayoutRequest:
    """Approve a requested payout: post host_available → host_paid_out (key ``payout:<id>``).

    Raises PayoutError when it is not ``requested`` or the host's available
    balance no longer covers it.
    """
    now = now or timezone.now()
    payout = (
        PayoutRequest.objects.select_for_update()
        .select_related("host")
        .get(id=payout_id)
    )
    if payout.status != PayoutRequest.Status.REQUESTED:
        raise PayoutError(f"payout {payout.id} is {payout.status}, not requested")
    available = _host_available_locked(payout.host)
    if payout.amount_nano > available:
        raise PayoutError(
            f"payout {payout.id}: {nano_to_usd_str(payout.amount_nano)} USD exceeds the "
            f"available {nano_to_usd_str(available)} USD"
        )
    ledger_post(
        kind=LedgerTransaction.Kind.PAYOUT,
        key=f"payout:{payout.id}",
        legs=[
            (
                account_for(kind=Account.Kind.HOST_AVAILABLE, user=payout.host),
                -payout.amount_nano,
            ),
            (
                account_for(kind=Account.Kind.HOST_PAID_OUT, user=payout.host),
                payout.amount_nano,
            ),
        ],
        memo=f"payout {payout.id} approved by {staff.get_username()}",
    )
    payout.status = PayoutRequest.Status.APPROVED
    payout.decided_at = now
    payout.decided_by = staff
    payout.save(update_fields=["status", "decided_at", "decided_by"])
    return payout


@transaction.atomic
def payout_reject(
    *, payout_id: int, staff: AbstractBaseUser, now: datetime | None = None
) -> PayoutRequest:
    """Reject a requested payout; no money moves. Raises PayoutError if not ``requested``."""
    now = now or timezone.now()
    payout = PayoutRequest.objects.select_for_update().get(id=payout_id)
    if payout.status != PayoutRequest.Status.REQUESTED:
        raise PayoutError(f"payout {payout.id} is {payout.status}, not requested")
    payout.status = PayoutRequest.Status.REJECTED
    payout.decided_at = now
    payout.decided_by = staff
    payout.save(update_fields=["status", "decided_at", "decided_by"])
    return payout


@transaction.atomic
def payout_mark_paid(*, payout_id: int, now: datetime | None = None) -> PayoutRequest:
    """Record that an approved payout's money was sent. Raises PayoutError otherwise."""
    now = now or timezone.now()
    payout = PayoutRequest.objects.select_for_update().get(id=payout_id)
    if payout.status != PayoutRequest.Status.APPROVED:
        raise PayoutError(f"payout {payout.id} is {payout.status}, not approved")
    payout.status = PayoutRequest.Status.PAID
    payout.paid_at = now
    payout.save(update_fields=["status", "paid_at"])
    return payout
