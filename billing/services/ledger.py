"""The ledger's writes: accounts, and one balanced transaction per key.

Every function that moves money writes one balanced transaction (entries sum to
zero) under a unique idempotency key, so a retry or a concurrent duplicate writes
nothing twice (DESIGN.md "Money"; the rules with worked numbers are in
docs/money.md). All amounts are integer nano-USD (``billing.money``).
"""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import IntegrityError, connection, transaction

from ballast import metrics
from ballast.writes import insert_rows_sql, insert_sql, update_then
from ballast.rows import columns, instances

from ..models import Account, Entry, LedgerTransaction
from .balance_low import balance_low_mark, balance_low_rearm


class UnbalancedTransaction(ValueError):
    """The legs of a ledger transaction do not sum to zero."""


def account_for(
    *,
    kind: str,
    user: AbstractBaseUser | None = None,
    user_id: int | None = None,
) -> Account:
    """Return the ledger account of this kind: the user's (given as ``user`` or
    by ``user_id``), or the system one when neither is given (``accounts_for``).
    """
    owner = user.pk if user is not None else user_id
    return accounts_for([(kind, owner)])[0]


_ACCOUNT = (Account, "a")


def accounts_for(wanted: list[tuple[str, int | None]]) -> list[Account]:
    """The ledger accounts of ``wanted`` (kind, user id or None for the system
    account of that kind), in that order, read in one statement (a charge
    needs three).

    Each is created on first use; a concurrent first use is settled by the
    unique constraints on (kind, user).
    """
    where, params = [], []
    for kind, owner in wanted:
        if owner is None:
            where.append("(a.kind = %s AND a.user_id IS NULL)")
            params.append(kind)
        else:
            where.append("(a.kind = %s AND a.user_id = %s)")
            params += [kind, owner]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {columns(_ACCOUNT)} FROM billing_account a WHERE "
            + " OR ".join(where),
            params,
        )
        rows = cursor.fetchall()
    found = {
        (account.kind, account.user_id): account
        for (account,) in (instances(row, _ACCOUNT) for row in rows)
    }
    return [found.get(want) or _account_make(*want) for want in wanted]


def _account_make(kind: str, owner: int | None) -> Account:
    """The account (kind, owner) on its first use, made unless a concurrent
    first use made it."""
    try:
        with transaction.atomic():
            account, _ = Account.objects.get_or_create(kind=kind, user_id=owner)
    except IntegrityError:
        account = Account.objects.get(kind=kind, user_id=owner)
    return account


def ledger_post(
    *,
    kind: str,
    key: str,
    legs: list[tuple[Account, int]],
    job_id=None,
    memo: str = "",
    actor: AbstractBaseUser | None = None,
    stored_with: list | tuple = (),
) -> LedgerTransaction | None:
    """Write one balanced transaction; return it, or None if ``key`` was already posted.

    ``legs`` are (account, nano-USD) pairs, > 0 credits and < 0 debits; zero legs
    are dropped. ``job_id``: the job it belongs to (UUID or str), if any.
    ``memo`` (why) is cut to 300 characters; ``actor``: the staff member who
    made it, if one did. A renter credit leg also keeps the account's
    low-balance state (``balance_low.balance_low_mark`` after a debit,
    ``balance_low_rearm`` after a credit: docs/money.md "Low balance").
    Raises UnbalancedTransaction when the legs do not sum to zero or none is
    left (the database refuses an unbalanced transaction too: docs/money.md).
    ``stored_with``: unsaved model instances of one model stored with it, in
    their order, only when it is posted (a charge's earnings). The
    transaction, its entries and those rows are one statement on PostgreSQL
    (``ballast.writes.update_then``; three on SQLite). Works inside a caller's
    transaction: a key posted before writes nothing (``INSERT … ON CONFLICT DO
    NOTHING``: no savepoint).
    """
    legs = [(account, amount) for account, amount in legs if amount]
    total = sum(amount for _, amount in legs)
    if total != 0 or not legs:
        raise UnbalancedTransaction(f"{kind} {key}: {len(legs)} legs sum to {total}")
    txn = LedgerTransaction(
        kind=kind,
        key=key,
        job_id=job_id,
        memo=memo[:300],
        actor=actor,
        leg_count=len(legs),
    )
    sql, params = insert_sql(txn)
    # the entries name the transaction the claim stored (none when the key was
    # posted before: then nothing is written), in the legs' order
    entries = [Entry(account=account, amount_nano=amount) for account, amount in legs]
    steps = [insert_rows_sql(entries, exprs={"transaction_id": ("claimed.id", [])})]
    if stored_with:
        steps.append(insert_rows_sql(list(stored_with)))
    posted = update_then(
        (f"{sql} WHERE true ON CONFLICT DO NOTHING RETURNING id", params),
        ("id",),
        steps,
    )
    if posted is None:
        if LedgerTransaction.objects.filter(key=key).exists():
            return None
        raise IntegrityError(f"ledger transaction {key}: a unique value taken")
    txn.id = posted[0]
    txn._state.adding, txn._state.db = False, connection.alias
    for account, amount in legs:
        if account.kind == Account.Kind.RENTER_CREDIT:
            if amount < 0:
                balance_low_mark(account_id=account.id)
            else:
                balance_low_rearm(account_id=account.id)
    metrics.ledger_posted(
        kind=kind, credits_nano=sum(amount for _, amount in legs if amount > 0)
    )
    return txn

