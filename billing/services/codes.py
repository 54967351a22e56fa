"""Credit codes: staff make them, renters redeem them for credit (docs/money.md
"Credit codes").

A redemption is one transaction on the code's locked row: checked (active, not
expired, not used up, not redeemed by this renter before), recorded, counted
and credited through ``credit_add`` (source ``code``), so two redemptions at
once credit once where the code allows once.
"""

from __future__ import annotations

import re
import secrets
from datetime import datetime

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ..models import CreditCode, CreditCodeRedemption, LedgerTransaction
from ..templatetags.billing_money import usd_text
from .credit import CreditError, CreditSource, credit_add

# no 0/O, 1/I/L: read aloud and typed without doubt; 16 symbols of 32 = 80 bits
CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
_CODE = re.compile(r"[A-Z0-9-]{4,40}")


class CreditCodeError(CreditError):
    """A code that cannot be redeemed (unknown, expired, used up, redeemed before)."""


def credit_code_normalize(text: str) -> str:
    """A code as stored: upper case, without spaces (renters type either)."""
    return "".join((text or "").split()).upper()


def credit_code_new_text() -> str:
    """A fresh random code, ``XXXX-XXXX-XXXX-XXXX`` (80 bits: not guessable)."""
    chars = "".join(secrets.choice(CODE_ALPHABET) for _ in range(16))
    return "-".join(chars[i : i + 4] for i in range(0, 16, 4))


@transaction.atomic
def credit_code_create(
    *,
    amount_nano: int,
    max_redemptions: int = 1,
    expires_at: datetime | None = None,
    memo: str = "",
    created_by: AbstractBaseUser | None = None,
    code: str = "",
) -> CreditCode:
    """Make a code worth ``amount_nano`` (> 0) per redemption, redeemable
    ``max_redemptions`` (≥ 1) times in all, until ``expires_at``; ``code``:
    the text (4–40 of A–Z, 0–9, ``-``; empty: a random one). Raises
    CreditCodeError for a bad amount, count or text."""
    if amount_nano <= 0:
        raise CreditCodeError("a code must be worth more than $0.00")
    if max_redemptions < 1:
        raise CreditCodeError("a code must be redeemable at least once")
    text = credit_code_normalize(code) or credit_code_new_text()
    if not _CODE.fullmatch(text):
        raise CreditCodeError("a code is 4–40 letters, digits and dashes")
    if CreditCode.objects.filter(code=text).exists():
        raise CreditCodeError(f"the code {text} exists already")
    return CreditCode.objects.create(
        code=text,
        amount_nano=amount_nano,
        max_redemptions=max_redemptions,
        expires_at=expires_at,
        memo=memo[:300],
        created_by=created_by,
    )


@transaction.atomic
def credit_code_redeem(
    *, user: AbstractBaseUser, code: str, now: datetime | None = None
) -> LedgerTransaction:
    """Redeem ``code`` (any case, spaces ignored) for ``user``: its amount added
    to their credit (``credit_add``, source ``code``, reference
    ``<code id>:<user id>``, memo "credit code <code>"). Returns the ledger
    transaction.

    The code's row is locked (PostgreSQL ``SELECT … FOR UPDATE``; SQLite: its
    one writer) for the whole step. Raises CreditCodeError when the code is
    unknown or switched off, expired, used ``max_redemptions`` times, or
    already redeemed by this renter; nothing is credited then.
    """
    now = now or timezone.now()
    text = credit_code_normalize(code)
    found = CreditCode.objects.select_for_update().filter(code=text).first()
    if found is None or not found.active:
        raise CreditCodeError("There is no such credit code.")
    if found.expires_at is not None and found.expires_at <= now:
        raise CreditCodeError(
            f"This code expired on {found.expires_at.day} "
            f"{found.expires_at:%b %Y, %H:%M} UTC."
        )
    if CreditCodeRedemption.objects.filter(code=found, user=user).exists():
        raise CreditCodeError("You have already redeemed this code.")
    if found.redeemed_count >= found.max_redemptions:
        raise CreditCodeError("This code has been used up.")
    txn = credit_add(
        user=user,
        amount_nano=found.amount_nano,
        source=CreditSource.CODE,
        reference=f"{found.id}:{user.pk}",
        memo=f"credit code {found.code}",
    )
    if txn is None:  # the ledger has it already: the same redemption
        raise CreditCodeError("You have already redeemed this code.")
    CreditCodeRedemption.objects.create(code=found, user=user, transaction=txn)
    CreditCode.objects.filter(id=found.id).update(
        redeemed_count=F("redeemed_count") + 1
    )
    return txn


def credit_code_words(txn: LedgerTransaction) -> str:
    """What a redemption added, in words for the renter: "$5.00 added"."""
    amount = txn.entries.filter(amount_nano__gt=0).values_list("amount_nano", flat=True)
    return f"{usd_text(sum(amount))} added to your credit."
