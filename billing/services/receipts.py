"""The receipt of an attempt's ``done``: judged once, stored once (PROTOCOL.md §2).

Only a ``valid`` verdict lets the attempt's host be paid (DESIGN.md "Money").
"""

from __future__ import annotations

from django.db import IntegrityError, transaction

from ballast.writes import insert_once

from ..models import ReceiptCheck
from ..receipts import receipt_verify


@transaction.atomic(savepoint=False)  # inside a job's end: no savepoint of its own
def receipt_check(
    *,
    attempt_id,
    device_id: int,
    public_key_b64: str,
    signature_b64: str,
    completion_tokens: int,
    text: str,
) -> str:
    """Judge and store the receipt of attempt ``attempt_id``'s ``done``; return the
    verdict that stands (a ``ReceiptCheck.Verdict`` value).

    ``attempt_id``: the attempt's UUID (or its str); ``device_id``: the device that
    ran it; ``public_key_b64``: that machine's pinned Ed25519 key;
    ``signature_b64``: the receipt sent (empty: none; cut to 200 characters);
    ``completion_tokens`` and ``text``: the count reported and the exact text
    relayed. Judged by ``receipt_verdict``; a signature already stored (for
    another attempt, or a second ``done``) is ``replayed`` and stored as NULL.

    One ``ReceiptCheck`` per attempt: a second call for the same attempt returns
    the first verdict and writes nothing. The unique keys of the table (attempt,
    signature) decide, so a concurrent second ``done`` or the same signature
    racing in for another attempt ends the same way. Works inside a caller's
    transaction (``ballast.writes.insert_once``: no savepoint).
    """
    signature = (signature_b64 or "")[:200] or None
    verdict = receipt_verdict(
        signature=signature,
        replayed=False,  # the unique signature decides it, below
        public_key_b64=public_key_b64,
        attempt_id=str(attempt_id),
        completion_tokens=completion_tokens,
        text=text,
    )
    stored = insert_once(
        ReceiptCheck(
            attempt_id=attempt_id,
            device_id=device_id,
            signature=signature,
            verdict=verdict,
        )
    )
    if stored:
        return verdict
    first = (
        ReceiptCheck.objects.filter(attempt_id=attempt_id)
        .values_list("verdict", flat=True)
        .first()
    )
    if first is not None:  # a second done of this attempt: its verdict stands
        return first
    if signature is None:
        raise IntegrityError(f"receipt check of {attempt_id}: a unique value taken")
    verdict = ReceiptCheck.Verdict.REPLAYED  # the signature is stored already
    ReceiptCheck.objects.create(
        attempt_id=attempt_id, device_id=device_id, signature=None, verdict=verdict
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
    ``valid`` for an Ed25519 signature by ``public_key_b64`` over (``attempt_id``,
    ``completion_tokens``, sha256 of ``text``), ``invalid`` for a bad signature
    or a text hash that does not match (``billing.receipts.receipt_verify``)."""
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
