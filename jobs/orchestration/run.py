"""The coroutine that owns a job from dispatch to its end (DESIGN.md "How a
request flows" steps 3–8).

``JobRun`` dispatches an attempt, sends the offer to the machine's connection
through the channel layer, awaits that attempt's frames on its own channel with
asyncio deadlines (claim, first token, stall: ``follow.segment_follow``), yields
each piece of text as it comes and, after a failure, does what ``failover``
decides: another attempt, the one continuation, or the end (recorded by
``endings.JobEndings``). The text delivered is kept exactly, so billing and the
continuation's ``continue_from`` are both the renter's own text.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator

from channels.layers import get_channel_layer
from django.conf import settings

from ballast import local
from ballast.db import db_call, db_call_retried
from catalog.modeldata import model_tokenizer, model_tokenizer_load
from catalog.models import CatalogModel

from .. import services
from ..failover import (
    Complete,
    Fail,
    Failover,
    after_empty_answer,
    after_failed_attempt,
    when_not_dispatched,
)
from ..models import Attempt, Job
from ..services.deadlines import CLAIM, stage_timeout_s
from .budget import OutputBudget
from .channels import offer_message, slots_announce_soon
from .endings import JobEndings
from .events import Failed, Finished, Segment, Token
from .follow import segment_follow
from .inbox import JobInbox
from .lease import LEASE_LOST, job_lease_keep

log = logging.getLogger("ballast.jobs")

# a queued job looks for a slot at least this often (s), woken or not
SLOT_POLL_S = 2.0


class JobRun(JobEndings):
    """Run one stored job; iterate ``events()`` for Token / Finished / Failed.

    Closing the iterator early (the renter went away) cancels the job: the host
    is told to stop, the slot frees, and the renter is billed for what was
    delivered. With ``whole_at_end`` (a non-streamed response) the renter
    receives the text only with the job's last event; a renter who goes away
    before it pays for the text its host produced up to the cancel, as one who
    streamed would (DESIGN.md "Money": "streamed or not"; ``_end_segment``).
    """

    def __init__(
        self,
        job: Job,
        *,
        model: CatalogModel | None = None,
        channel: str = "",
        dispatch: services.Dispatch | None = None,
        whole_at_end: bool = False,
    ) -> None:
        """``model``, ``channel`` (made by ``ballast.local.channel_new``, so
        replies to it are kept from the start) and the first ``dispatch`` come
        from the request's transaction (``services.job_open``); what is not
        given is read or made when ``events()`` starts."""
        self.job = job
        self.job_id = str(job.id)
        self.whole_at_end = whole_at_end
        self.layer = get_channel_layer()
        self.channel = channel
        self.model = model
        self.first_dispatch = dispatch
        self.budget = OutputBudget(
            model_id=job.model_id, max_tokens=job.params.get("max_tokens")
        )
        self.segment: Segment | None = None
        self.finished = False
        # the end of an answer its host completed (``_succeed``) and the record
        # of a failed attempt's end (``_end_segment``): once begun each runs to
        # its end whatever happens to the request (``_cancel`` waits)
        self.ending: asyncio.Future | None = None
        self.segment_ending: asyncio.Future | None = None
        self.inbox = JobInbox(channel)
        self.lease_lost = False

    @property
    def delivered_text(self) -> str:
        return self.budget.text

    async def events(self) -> AsyncIterator[Token | Finished | Failed]:
        """Yield the job's events until it ends; see the class docstring."""
        if not self.channel:
            self.channel = await local.channel_new(self.layer)
        if self.model is None:
            self.model = await db_call(CatalogModel.objects.get)(id=self.job.model_id)
        # the model's tokenizer, read and built off the event loop before the
        # budget counts with it (``catalog.modeldata.model_tokenizer``): a
        # thread's turn before the offer only until this process has built it
        if model_tokenizer(self.job.model_id) is None:
            await db_call(model_tokenizer_load)(self.job.model_id)
        self.inbox = JobInbox(self.channel)
        lease = asyncio.create_task(
            job_lease_keep(job_id=self.job_id, lost=self._lease_lost)
        )
        local.reader_add(self.channel, self.inbox.deliver)
        failure: Exception | None = None
        try:
            async for event in self._run():
                yield event
        except Exception as exc:  # the coordinator's own failure, not the renter's
            failure = exc
            raise
        finally:
            # the close goes on even when this task is cancelled (the renter
            # went away), keeps reading the channel until it is done (it may
            # wait for the host's receipt, ``_receipt_wait``) and keeps the
            # lease while it rides through a database outage (``db_call_durable``)
            await asyncio.shield(self._close(lease, failure))

    async def _close(self, lease: asyncio.Task, failure: Exception | None) -> None:
        """End a job left unfinished (``_cancel``), then stop renewing its lease
        and reading its channel."""
        try:
            if not self.finished:
                await self._cancel(failure)
        finally:
            lease.cancel()
            local.reader_remove(self.channel, self.inbox.deliver)

    def _lease_lost(self) -> None:
        """The job's lease was lost (``job_lease_keep``): its coroutine stops at
        the next message (the host is told to cancel)."""
        if not self.finished:
            self.lease_lost = True
            self.inbox.put({"type": "job.lease_lost"})

    # --- the job ----------------------------------------------------------------
    async def _run(self) -> AsyncIterator[Token | Finished | Failed]:
        loop = asyncio.get_running_loop()
        queue_deadline = loop.time() + settings.BALLAST_QUEUE_TIMEOUT_S
        state = Failover()
        waited = False  # the job waited in the queue for a slot
        while True:
            continue_from = self.delivered_text
            if continue_from and loop.time() > queue_deadline:
                queue_deadline = loop.time() + stage_timeout_s(CLAIM)
            dispatch, self.first_dispatch = self.first_dispatch, None
            if dispatch is not None and dispatch.wait:
                # made in the transaction that stored the job: a slot freed before
                # it committed woke nobody, so look once more before waiting
                dispatch = None
            if self.lease_lost:
                yield await self._fail_as(LEASE_LOST)
                return
            if dispatch is None:
                dispatch = await db_call_retried(services.job_dispatch)(
                    job=self.job,
                    model=self.model,
                    continue_from=continue_from,
                    waiting_channel=self.channel,
                )
            if state.empty_answers and (dispatch.impossible or dispatch.wait):
                # no second opinion to be had now: the empty answer stands (a
                # renter does not wait in the queue for one)
                yield await self._complete()
                return
            if dispatch.impossible or (dispatch.wait and queue_deadline <= loop.time()):
                yield await self._fail_as(
                    when_not_dispatched(
                        state,
                        impossible=dispatch.impossible,
                        exhausted=dispatch.exhausted,
                        continuing=bool(continue_from),
                        model_id=self.job.model_id,
                        queue_timeout_s=settings.BALLAST_QUEUE_TIMEOUT_S,
                    )
                )
                return
            if dispatch.contended:
                await asyncio.sleep(random.uniform(0.001, 0.01))  # its row frees in ms
                continue
            if dispatch.wait:
                await self._wait_for_slot(
                    min(queue_deadline - loop.time(), SLOT_POLL_S)
                )
                waited = True
                continue
            if waited:
                # a queued job got a slot: wake the next ones, there may be more
                waited = False
                slots_announce_soon([self.job.model_id])
            segment = Segment(
                attempt=dispatch.attempt, machine_channel=dispatch.machine_channel
            )
            self.segment = segment
            await local.channel_send(
                self.layer,
                dispatch.machine_channel,
                offer_message(str(segment.attempt.id), self.channel, dispatch.offer),
            )
            async for token in self._follow(segment):
                yield token
            if segment.outcome == Attempt.Outcome.SUCCEEDED:
                yield await self._succeed(segment)
                return
            await self._end_segment(segment)
            if self.lease_lost:
                yield await self._fail_as(LEASE_LOST)
                return
            finish_reason = "stop"
            if segment.outcome == Attempt.Outcome.EMPTY_ANSWER:
                explained = services.empty_answer_explained(self.job.params or {})
                if explained and (segment.done or {}).get("finish_reason") == "length":
                    finish_reason = "length"  # max_tokens cut its first character
                decision, state = after_empty_answer(
                    state,
                    explained=explained,
                    delivered=bool(self.delivered_text),
                    single_device=bool(self.job.target_device_id),
                )
            else:
                decision, state = after_failed_attempt(
                    state,
                    outcome=segment.outcome,
                    segment_had_output=bool(segment.pieces),
                    delivered=bool(self.delivered_text),
                    single_device=bool(self.job.target_device_id),
                    max_attempts=settings.BALLAST_MAX_ATTEMPTS,
                )
            if isinstance(decision, Complete):
                yield await self._complete(finish_reason)
                return
            if isinstance(decision, Fail):
                yield await self._fail_as(decision)
                return
            if decision.continuation:
                log.info("job %s: continuation after %s", self.job_id, segment.outcome)

    async def _wait_for_slot(self, timeout: float) -> None:
        """Sleep until a slot of the model frees (a wake-up message) or ``timeout`` s."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            try:
                message = await self.inbox.next(left)
            except TimeoutError:
                return
            if message.get("type") in ("slot.free", "job.lease_lost"):
                return

    def _follow(self, segment: Segment) -> AsyncIterator[Token]:
        """Yield the attempt's text pieces; set ``segment.outcome`` when it ends
        (``follow.segment_follow``)."""
        return segment_follow(
            segment,
            inbox=self.inbox,
            budget=self.budget,
            model_id=self.job.model_id,
            receipt_wait=self._receipt_wait,
        )
