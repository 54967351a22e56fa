"""Following one attempt of a job (DESIGN.md "How a request flows" steps 5–7):
its frames read from the job's inbox under the attempt's deadlines (claim,
first token, stall), its text delivered within the renter's budget, and the
host's receipt awaited when the coordinator stops an attempt the renter
received text of. ``run.JobRun`` calls these for each attempt it dispatches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from django.conf import settings
from django.utils import timezone

from ballast import local

from ..models import Attempt
from ..services.deadlines import (
    CLAIM,
    FIRST_TOKEN,
    NEXT_TOKEN,
    TIMEOUT_OUTCOMES,
    stage_timeout_s,
)
from ..tokens import token_count
from .budget import OutputBudget
from .channels import cancel_message
from .events import Segment, Token
from .inbox import JobInbox

log = logging.getLogger("ballast.jobs")


async def segment_follow(
    segment: Segment,
    *,
    inbox: JobInbox,
    budget: OutputBudget,
    model_id: str,
    receipt_wait: Callable[[Segment], Awaitable[dict | None]],
) -> AsyncIterator[Token]:
    """Yield the attempt's text pieces (with their tokens' logprobs when
    asked), as its frames come to ``inbox``; set ``segment.outcome`` (and
    ``error``, ``claimed_at``, ``first_token_at``, ``done``) when it ends.

    A stage without its frame in time (``deadlines.stage_timeout_s``) ends it
    with that stage's timeout outcome; the job's lease lost, a token out of
    order (lost between coordinator processes) cancel it. Text past the
    renter's ``budget`` (``max_tokens``) ends it as a success at ``length``,
    with the host's receipt for what was delivered (``receipt_wait``, which
    tells the host to stop). Frames of other attempts are skipped.
    """
    loop = asyncio.get_running_loop()
    attempt_id = str(segment.attempt.id)
    stage = CLAIM
    deadline = loop.time() + stage_timeout_s(stage)
    while True:
        try:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError
            message = await inbox.next(left)
        except TimeoutError:
            segment.outcome = TIMEOUT_OUTCOMES[stage]
            segment.error = f"no frame within the deadline ({segment.outcome})"
            return
        if message.get("type") == "job.lease_lost":
            segment.outcome = Attempt.Outcome.CANCELLED
            segment.error = "the job's lease was lost"
            return
        if message.get("attempt") != attempt_id:
            continue  # late frames of an earlier attempt, or a stray wake-up
        kind = message["type"]
        if kind == "host.claim":
            segment.claimed_at = timezone.now()  # the consumer records it too
            stage = FIRST_TOKEN
            deadline = loop.time() + stage_timeout_s(stage)
        elif kind == "host.token":
            if message.get("at", segment.received) != segment.received:
                # a message lost between processes (Redis pub/sub delivers at
                # most once, e.g. across a restart): what follows would not
                # continue what the renter has; not the host's fault
                segment.outcome = Attempt.Outcome.CANCELLED
                segment.error = "tokens lost between coordinator processes"
                return
            if not segment.pieces:
                segment.first_token_at = timezone.now()  # written when it ends
            entries = message.get("logprobs")
            if entries is not None:
                entries = list(entries)
            received = message["text"] + inbox.more_text(
                attempt_id,
                at=segment.received + len(message["text"]),
                logprobs=entries,
            )
            segment.received += len(received)
            text, over = budget.take(received)
            if entries is not None:
                entries = segment.logprobs_delivered(entries, text, cut=over)
            if text:
                segment.pieces.append(text)
                yield Token(text, entries)
            if over:
                # past max_tokens: the answer ends there; the host is paid
                # for what the renter received against its cancel receipt
                segment.outcome = Attempt.Outcome.SUCCEEDED
                segment.done = {
                    "finish_reason": "length",
                    "prompt_tokens": None,  # counted at the job's end
                    "completion_tokens": token_count(model_id, segment.text) or 0,
                    "receipt": None,  # asked for: ``cancel_receipt``
                }
                segment.cancel_receipt = await receipt_wait(segment)
                return
            stage = NEXT_TOKEN
            deadline = loop.time() + stage_timeout_s(stage)
        elif kind == "host.done":
            segment.done = message["done"]
            if not segment.pieces:  # never an empty success (DESIGN.md)
                segment.outcome = Attempt.Outcome.EMPTY_ANSWER
                segment.error = "done without any output"
            else:
                segment.outcome = Attempt.Outcome.SUCCEEDED
            return
        elif kind in ("host.error", "host.gone"):
            segment.outcome = (
                Attempt.Outcome.DIED_MIDSTREAM
                if segment.pieces
                else Attempt.Outcome.HOST_ERROR
            )
            segment.error = message.get("message", "")
            return


async def receipt_wait(
    segment: Segment, *, inbox: JobInbox, layer, reply_channel: str, job_id: str
) -> dict | None:
    """Tell the host to stop a segment the renter received text of, and wait
    (at most ``BALLAST_CANCEL_RECEIPT_WAIT_S``) for its answer in ``inbox``:
    its usage and receipt over the text it sent (``cancelled``), relayed with
    that text by its connection to ``reply_channel`` (the job's). None when
    none comes (a host that died, or one that does not answer)."""
    attempt_id = str(segment.attempt.id)
    await local.channel_send(
        layer,
        segment.machine_channel,
        cancel_message(attempt_id, reply=reply_channel),
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.BALLAST_CANCEL_RECEIPT_WAIT_S
    while (left := deadline - loop.time()) > 0:
        try:
            message = await inbox.next(left)
        except TimeoutError:
            break
        if message.get("attempt") != attempt_id:
            continue
        if message["type"] == "host.cancelled":
            return message["cancelled"]
        if message["type"] == "host.gone":
            return None
    log.info("job %s: no receipt for the cancelled %s", job_id, attempt_id)
    return None
