"""How a job's coroutine ends its attempts and the job (DESIGN.md "How a request
flows" steps 7–8): ``JobEndings``, the half of ``run.JobRun`` that records an
end. An attempt failed or cancelled (``_end_segment``: the host's receipt first
when the renter went away with text, ``_receipt_wait``); the job succeeded
(``_succeed``: ``services.job_succeed``, once), answered by the text delivered
(``_complete``: ``services.job_answered``), failed as ``failover`` decides
(``_fail_as``) or cancelled (``_cancel``: the renter went away, or the
coordinator failed). Each end bills what was delivered (``services.job_finish``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from django.db import DatabaseError

from ballast import local
from ballast.db import db_call_durable

from .. import services
from ..failover import Fail
from ..models import Attempt, Job
from .channels import cancel_message, slots_announce_soon, slots_wake_soon
from .events import Failed, Finished, Segment, usage_of
from .follow import receipt_wait

log = logging.getLogger("ballast.jobs")


class JobEndings:
    """The ends of a ``run.JobRun`` (a mixin: it reads and sets the run's
    ``job``, ``job_id``, ``layer``, ``channel``, ``inbox``, ``budget``,
    ``whole_at_end``, ``segment``, ``ending``, ``segment_ending``, ``finished``
    and ``delivered_text``)."""

    async def _receipt_wait(self, segment: Segment) -> dict | None:
        """The host's receipt of a segment it is told to stop
        (``follow.receipt_wait``); None when none comes."""
        return await receipt_wait(
            segment,
            inbox=self.inbox,
            layer=self.layer,
            reply_channel=self.channel,
            job_id=self.job_id,
        )

    async def _end_segment(self, segment: Segment) -> None:
        """End a failed or cancelled attempt: record it, tell the host, free the
        slot. A segment with text that the coordinator ended (the renter went
        away) first asks the host for its receipt (``_receipt_wait``), so the
        host is paid for what the renter is billed: the text received, or with
        ``whole_at_end`` the text produced up to the cancel
        (``Segment.produced_take``). Shielded: a renter going away meanwhile
        must not leave the attempt to the job's close, which would end it with
        no text (``_cancel``)."""
        receipt_wanted = segment.outcome == Attempt.Outcome.CANCELLED and bool(
            segment.pieces
        )
        if receipt_wanted:
            segment.cancel_receipt = await self._receipt_wait(segment)
            if self.whole_at_end:
                segment.produced_take(self.budget)
        self.segment_ending = asyncio.ensure_future(
            db_call_durable(services.attempt_end)(
                attempt_id=str(segment.attempt.id),
                outcome=segment.outcome,
                output_text=segment.text,
                error=segment.error,
                claimed_at=segment.claimed_at,
                first_token_at=segment.first_token_at,
                cancel_receipt=segment.cancel_receipt,
            )
        )
        await asyncio.shield(self.segment_ending)
        if not receipt_wanted:
            await local.channel_send(
                self.layer,
                segment.machine_channel,
                cancel_message(str(segment.attempt.id)),
            )
        slots_announce_soon([self.job.model_id])

    async def _succeed(self, segment: Segment) -> Finished:
        """End the job as the success its host completed and return its last
        event. Shielded: a renter who goes away now has the answer already, and
        it is billed as delivered (``_cancel`` waits for this end)."""
        job = await asyncio.shield(self._success_end(segment))
        self.finished = True
        return Finished(finish_reason=job.finish_reason, usage=usage_of(job))

    def _success_end(self, segment: Segment) -> asyncio.Future:
        """The task that ends the job as a success (made once)."""
        if self.ending is None:
            self.ending = asyncio.ensure_future(self._success_record(segment))
        return self.ending

    async def _success_record(self, segment: Segment) -> Job:
        job = await db_call_durable(services.job_succeed)(
            job_id=self.job_id,
            attempt_id=str(segment.attempt.id),
            segment_text=segment.text,
            done=segment.done,
            answer_text=self.delivered_text,
            claimed_at=segment.claimed_at,
            first_token_at=segment.first_token_at,
            cancel_receipt=segment.cancel_receipt,
        )
        slots_wake_soon(job.channels_to_wake)
        if job.ended_then is not None:  # (the verification drawn, sent)
            job.ended_then()
        return job

    async def _complete(self, finish_reason: str = "stop") -> Finished:
        """End the job as answered by the text delivered (``failover.Complete``:
        the model ended there, maybe at once, or ``max_tokens`` cut its first
        character: ``finish_reason`` ``length``; ``services.job_answered``)."""
        job = await db_call_durable(services.job_answered)(
            job_id=self.job_id,
            output_text=self.delivered_text,
            finish_reason=finish_reason,
        )
        self.finished = True
        return Finished(finish_reason=job.finish_reason, usage=usage_of(job))

    async def _fail_as(self, fail: Fail) -> Failed:
        """Close the job as ``fail`` says (billed for what was delivered)."""
        delivered = bool(self.delivered_text)
        job = await db_call_durable(services.job_finish)(
            job_id=self.job_id,
            status=fail.job_status,
            output_text=self.delivered_text,
            finish_reason="error" if delivered else "",
            error_code=fail.code,
            error_message=fail.message,
        )
        self.finished = True
        return Failed(
            status=fail.status,
            code=fail.code,
            message=fail.message,
            after_output=delivered,
            usage=usage_of(job),
        )

    async def _cancel(self, failure: Exception | None = None) -> None:
        """The renter went away (or, with ``failure``, the coordinator failed):
        stop the host, free the slot, bill what was delivered (with
        ``whole_at_end``, produced: ``_end_segment``); the job is cancelled, or
        failed naming the failure."""
        segment = self.segment
        if self.segment_ending is not None and not self.segment_ending.done():
            with contextlib.suppress(Exception):
                await self.segment_ending
        if segment is not None and segment.outcome == Attempt.Outcome.SUCCEEDED:
            # the host completed the answer and the renter has it: its end is
            # the success's, not a cancel that would leave it unbilled
            try:
                await self._success_end(segment)
                self.finished = True
                return
            except Exception:
                log.exception("job %s: ending the completed answer failed", self.job_id)
                segment.outcome = ""
        try:
            if segment is not None and not segment.outcome:
                segment.outcome = Attempt.Outcome.CANCELLED
                await self._end_segment(segment)
        except Exception:
            log.exception("job %s: ending the attempt after cancel failed", self.job_id)
        if failure is None:
            status, code, message = (
                Job.Status.CANCELLED,
                "cancelled",
                "the renter disconnected",
            )
        else:
            status = Job.Status.FAILED
            code = (
                "database_unavailable"
                if isinstance(failure, DatabaseError)
                else "internal_error"
            )
            message = f"the coordinator failed: {failure}"[:500]
        try:
            await db_call_durable(services.job_finish)(
                job_id=self.job_id,
                status=status,
                output_text=self.delivered_text,
                error_code=code,
                error_message=message,
            )
        except Exception:
            log.exception("job %s: cleanup after cancel failed", self.job_id)
        self.finished = True
