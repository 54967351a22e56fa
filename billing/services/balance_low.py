"""The low-balance email: once when a renter's credit falls below their
threshold, again only after a credit brought it back up (docs/money.md "Low
balance").

The state is two columns of the renter's credit account, moved by
compare-and-set: ``low_balance_at`` set by the debit that crossed the
threshold (``balance_low_mark``, inside that debit's transaction, from
``ledger_post``) and cleared by a credit that ends it
(``balance_low_rearm``); ``low_balance_emailed_at`` set once the email went
(``balance_low_emails_send``, Celery beat). The comparison reads the running
``balance_nano`` the database keeps, so it costs one ``UPDATE`` of the row the
posting already locked.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from ballast.emails import send_templated

from ..models import Account
from ..money import usd_to_nano
from ..templatetags.billing_money import usd_text


def balance_low_threshold_nano(account: Account) -> int:
    """The account's threshold, nano-USD: its own, else ``BALLAST_LOW_BALANCE_USD``."""
    if account.low_balance_nano is not None:
        return account.low_balance_nano
    return usd_to_nano(settings.BALLAST_LOW_BALANCE_USD)


def _threshold():
    return Coalesce(
        F("low_balance_nano"), Value(usd_to_nano(settings.BALLAST_LOW_BALANCE_USD))
    )


def balance_low_mark(*, account_id: int, now: datetime | None = None) -> bool:
    """After a debit of renter credit account ``account_id``: note that its
    balance is below its threshold, when it is and was not already (a
    compare-and-set); True when this call noted it (an email will go)."""
    with connection.cursor() as cursor:  # a fixed statement: every charge runs it
        cursor.execute(
            _MARK_SQL,
            [
                connection.ops.adapt_datetimefield_value(now or timezone.now()),
                account_id,
                Account.Kind.RENTER_CREDIT,
                usd_to_nano(settings.BALLAST_LOW_BALANCE_USD),
            ],
        )
        return cursor.rowcount > 0


# ``balance_low_mark``'s compare-and-set (the threshold as ``_threshold``)
_MARK_SQL = (
    "UPDATE billing_account SET low_balance_at = %s, low_balance_emailed_at = NULL"
    " WHERE id = %s AND kind = %s AND low_balance_at IS NULL"
    " AND balance_nano < COALESCE(low_balance_nano, %s)"
)


def balance_low_rearm(*, account_id: int) -> bool:
    """After a credit: forget the low balance once the balance is back at or
    above the threshold, so the next fall below it emails again. True when it
    was forgotten."""
    return bool(
        Account.objects.filter(
            id=account_id,
            low_balance_at__isnull=False,
            balance_nano__gte=_threshold(),
        ).update(low_balance_at=None, low_balance_emailed_at=None)
    )


@transaction.atomic
def balance_low_threshold_set(*, user, threshold_nano: int | None) -> Account:
    """Set the renter's own threshold (nano-USD ≥ 0; 0: never email; None: the
    default) and judge the balance against it at once. Raises ValueError for a
    negative threshold."""
    from .ledger import account_for  # (ledger_post calls this module)

    if threshold_nano is not None and threshold_nano < 0:
        raise ValueError("the threshold must not be negative")
    account = account_for(kind=Account.Kind.RENTER_CREDIT, user=user)
    Account.objects.filter(id=account.id).update(low_balance_nano=threshold_nano)
    if not balance_low_rearm(account_id=account.id):
        balance_low_mark(account_id=account.id)
    account.refresh_from_db()
    return account


def balance_low_emails_send(*, now: datetime | None = None) -> int:
    """Email every renter whose balance went low and who was not emailed about
    it yet; return how many were emailed. Each is claimed by a compare-and-set
    on ``low_balance_emailed_at`` first, so two workers never send one twice.
    A renter without an email address is marked and skipped."""
    now = now or timezone.now()
    sent = 0
    due = Account.objects.filter(
        kind=Account.Kind.RENTER_CREDIT,
        low_balance_at__isnull=False,
        low_balance_emailed_at__isnull=True,
    ).select_related("user")
    for account in due[:500]:
        claimed = Account.objects.filter(
            id=account.id,
            low_balance_at__isnull=False,
            low_balance_emailed_at__isnull=True,
        ).update(low_balance_emailed_at=now)
        if not claimed or not account.user.email:
            continue
        send_templated(
            name="balance-low",
            to=[account.user.email],
            context={
                "account": account,
                "balance_text": usd_text(account.balance_nano),
                "threshold_text": usd_text(balance_low_threshold_nano(account)),
            },
        )
        sent += 1
    return sent
