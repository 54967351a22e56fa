"""An ended attempt's receipt judged (DESIGN.md "Money": a host is paid for
what its signed receipt covers): the ``done`` frame's over the text relayed,
and a cancelled segment's over the text its host sent (``attempts.attempt_end``
sets what they find on the attempt, which it then writes)."""

from __future__ import annotations

import logging

from billing.models import ReceiptCheck
from billing.services import receipt_check

from ..models import Attempt
from ..tokens import token_count, token_count_inflated

log = logging.getLogger("ballast.jobs")


def cancel_receipt_check(
    attempt: Attempt, *, output_text: str, answer: dict, canonical: bool
) -> None:
    """Judge the receipt of a cancelled segment (``attempt_end``'s
    ``cancel_receipt``) and set ``attempt.receipt`` and ``receipt_valid`` (not
    saved). Valid only when the text the host sent starts with what the
    renter received, its count is not inflated for that text (else the attempt
    is flagged; ``canonical``: ``tokens.canonical_split_expected`` for the
    job's request) and the signature verifies
    (``billing.services.receipt_check``, stored once per attempt)."""
    sent = answer.get("text")
    # a cancelled frame's prompt count is no report (agents send 0 there):
    # the job's end counts the prompt (``endings.renter_prompt_tokens``)
    attempt.prompt_tokens_reported = answer.get("prompt_tokens") or None
    attempt.receipt = (answer.get("receipt") or "")[:200]
    attempt.receipt_valid = False
    if sent is None or not sent.startswith(output_text):
        log.warning("attempt %s: cancel receipt without its text; unpaid", attempt.id)
        return
    model_id = attempt.job.model_id
    if token_count_inflated(
        reported=answer["completion_tokens"],
        text=sent,
        recount=token_count(model_id, sent),
        canonical=canonical,
    ):
        attempt.token_count_flagged = True
        return
    receipt_judge(
        attempt, completion_tokens=answer["completion_tokens"], text=sent, of="cancel "
    )


def receipt_judge(attempt: Attempt, *, completion_tokens: int, text: str, of=""):
    """Check ``attempt.receipt`` over ``text`` and ``completion_tokens`` against
    the machine's pinned key (``billing.services.receipt_check``, stored once per
    attempt) and set ``attempt.receipt_valid`` (not saved); ``of``: which receipt,
    for the log."""
    verdict = receipt_check(
        attempt_id=attempt.id,
        device_id=attempt.device_id,
        public_key_b64=attempt.device.machine.public_key,
        signature_b64=attempt.receipt,
        completion_tokens=completion_tokens,
        text=text,
    )
    attempt.receipt_valid = verdict == ReceiptCheck.Verdict.VALID
    if not attempt.receipt_valid:
        log.warning("attempt %s: %sreceipt %s; host not paid", attempt.id, of, verdict)
