"""The ``verify`` frame and its way to the verifier's connection (docs/protocol-
notes.md "Verification"): built from the verified job's offer, sent through the
channel layer to the verifier machine's consumer only (the verified host is
never sent anything about it)."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from channels.layers import get_channel_layer
from django.db import transaction
from django.utils import timezone

from ballast import local
from ballast.db import db_call
from jobs.formats import response_format_of
from jobs.models import Verification

from .answers import is_chat, verified_answer

log = logging.getLogger("ballast.jobs")

_sending: set[asyncio.Task] = set()


def verify_frame(*, ver: Verification, device_index: int) -> dict:
    """The ``verify`` frame of verification ``ver``, for the verifier's device
    ``device_index``: ``job`` the verification's id (hex, opaque: nothing ties
    it to the verified job), the model, the conversation (``messages``, or a
    completion's ``prompt``) and ``params`` as the verified job's offer had
    them (the temperature and top_p as the sampler takes them: floats, a
    missing one 1.0; ``stop`` always null: no verified answer was cut by one,
    and a check must not differ), and the ``answer`` its host delivered less
    what its token ids showed no text can carry (``answers.verified_answer``,
    ``exemptions``; a check of a verifier's alike), with ``token_ids``, the
    host's ids of it, when the coordinator found they spell it, and the job's
    ``response_format`` when it had one (only verified with its ids)."""
    verified = verified_answer(ver)
    params = verified.params
    top_p = params.get("top_p")
    frame = {
        "type": "verify",
        "job": ver.id.hex,
        "device": device_index,
        "model": verified.model_id,
        "params": {  # (the sampler's values, as floats: one spelling for all)
            "temperature": verified.temperature,
            "top_p": 1.0 if top_p is None else float(top_p),
            "max_tokens": params.get("max_tokens"),
            "stop": None,  # (a stop's cut last token is never in a verified answer)
            "seed": params.get("seed"),
        },
        "answer": verified.answer,
    }
    if verified.token_ids is not None:
        frame["token_ids"] = verified.token_ids
    constraint = response_format_of(params)
    if constraint is not None:  # scored under the grammar it was generated under
        frame["response_format"] = constraint
    if is_chat(verified):
        frame["messages"] = verified.messages
    else:
        frame["prompt"] = verified.prompt
    return frame


def verify_message(verification_id: str, frame: dict) -> dict:
    """The channel-layer message that has a machine's connection send ``frame``
    and expect its ``scores`` (``trust.consumers.ChecksRelay.verify_offer``)."""
    return {"type": "verify.offer", "verification": verification_id, "frame": frame}


@transaction.atomic
def verification_offer_take(
    *, verification_id: str, now: datetime | None = None
) -> tuple[str, dict] | None:
    """Mark verification ``verification_id`` (hex) sent (compare-and-set of
    ``sent_at``, so it goes out once) and return (the verifier machine's
    channel, its ``verify`` frame); None when it is not offered, was sent, or
    its verifier's machine has no connection."""
    now = now or timezone.now()
    ver = (
        Verification.objects.select_related("job", "verifier__machine")
        .filter(id=verification_id, status=Verification.Status.OFFERED)
        .first()
    )
    if ver is None or ver.verifier is None:
        return None
    channel = ver.verifier.machine.channel_name
    if not channel or not Verification.objects.filter(
        id=ver.id, sent_at__isnull=True
    ).update(sent_at=now):
        return None
    return channel, verify_frame(ver=ver, device_index=ver.verifier.index)


async def verification_send(verification_id: str) -> None:
    """Send verification ``verification_id``'s ``verify`` to its verifier's
    connection. Never raises: a failure is logged (the verification then
    expires, ``records.verifications_expire``)."""
    try:
        taken = await db_call(verification_offer_take)(verification_id=verification_id)
        if taken is None:
            return
        channel, frame = taken
        await local.channel_send(
            get_channel_layer(), channel, verify_message(verification_id, frame)
        )
    except Exception:
        log.exception("verification %s: sending the verify failed", verification_id)


def verification_send_soon(verification_id: str) -> None:
    """``verification_send`` in the background (the job's renter never waits)."""
    task = asyncio.get_running_loop().create_task(verification_send(verification_id))
    _sending.add(task)
    task.add_done_callback(_sending.discard)
