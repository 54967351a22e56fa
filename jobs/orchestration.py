"""The coroutine that owns a job from dispatch to its end (DESIGN.md "How a request flows").

``JobRun`` dispatches an attempt, sends the offer to the machine's connection
through the channel layer, awaits that attempt's frames on its own channel with
asyncio deadlines (claim, first token, stall), yields each piece of text as it
comes, fails over before the first token (up to ``BALLAST_MAX_ATTEMPTS``) and runs
the one continuation after it. The text delivered is kept exactly, so billing and
the continuation's ``continue_from`` are both the renter's own text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from ballast import local
from ballast.db import db_call, db_call_retried, retry_worthy

from . import services
from .models import Attempt, CatalogModel, Job
from .tokens import token_count

log = logging.getLogger("ballast.jobs")

SLOT_POLL_S = 2.0
# text of token messages delivered in-process (``ballast.local``) that may wait
# unread in a job's inbox, characters: a slow renter's backlog, before the host is
# cut off (the in-memory layer's bound is 5,000 messages)
LOCAL_INBOX_CHARS = 4_000_000

T = TypeVar("T")


async def slots_announce(model_ids, *, slots: int = 1) -> None:
    """Wake the oldest requests queued for these models: capacity came.

    Wakes ``2 × slots`` of them per model (oldest first, across every coordinator
    process), not all: a freed slot must not start a stampede of dispatches. A
    woken request that cannot use the slot leaves it to the next wake-up or to the
    fallback poll (``SLOT_POLL_S``).
    """
    for model_id in model_ids:
        channels = await db_call(services.jobs_waiting_channels)(
            model_id=model_id, limit=2 * slots
        )
        await slot_free_send(channels)


async def slot_free_send(channels: list[str]) -> None:
    """Send ``slot.free`` to each of ``channels`` (queued jobs' coroutines)."""
    layer = get_channel_layer()
    for channel in channels:
        await local.channel_send(layer, channel, {"type": "slot.free"})


_announcements: set[asyncio.Task] = set()


def slots_announce_soon(model_ids) -> None:
    """``slots_announce`` in the background: the caller (a finished answer, whose
    ``[DONE]`` should not wait for the queue's look-up) goes on at once. Failures
    are logged; the queued requests' fallback poll (``SLOT_POLL_S``) still runs."""
    task = asyncio.create_task(_slots_announce_logged(list(model_ids)))
    _announcements.add(task)
    task.add_done_callback(_announcements.discard)


async def _slots_announce_logged(model_ids: list[str]) -> None:
    try:
        await slots_announce(model_ids)
    except Exception:
        log.exception("announcing free slots of %s failed", model_ids)


async def channel_release(layer, channel: str) -> None:
    """Give back a channel made by ``new_channel`` that will never be read.

    The Redis pub/sub layer subscribes in ``new_channel`` and unsubscribes only
    when a pending ``receive`` is cancelled; without this, every refused request
    would leave a subscription behind.
    """
    reader = asyncio.ensure_future(layer.receive(channel))
    await asyncio.sleep(0)  # let the receive start, so its cancel cleans up
    reader.cancel()
    with contextlib.suppress(BaseException):
        await reader


async def job_channel_open(open_job: Callable[[str], Awaitable[T]]) -> tuple[str, T]:
    """Make a job's reply channel, then ``await open_job(channel)`` (the request's
    database step, ``services.job_open``); return (channel, its result).

    The channel exists before the offer can go out, so no reply is lost. If
    ``open_job`` raises (an ApiError for a refused request, or anything else), the
    channel is given back (``channel_release``) and the error re-raised.

    If the caller is cancelled meanwhile (the renter went away), the database
    step still ends (its own task, shielded): what it stored is closed at once
    (``_job_abandon``: the job cancelled, a claimed slot freed, nothing billed)
    instead of holding a slot and the renter's credit until its lease runs out;
    then the cancellation goes on.
    """
    layer = get_channel_layer()
    channel = await layer.new_channel("job.")
    step = asyncio.ensure_future(open_job(channel))
    try:
        return channel, await asyncio.shield(step)
    except asyncio.CancelledError:
        _abandoned.add(channel)  # an offer not sent yet is not sent (EarlyOffer)
        try:
            await asyncio.shield(_job_abandon(step))
        finally:
            _abandoned.discard(channel)
        local.reader_drop(channel)
        await channel_release(layer, channel)
        raise
    except BaseException:
        local.reader_drop(channel)
        await channel_release(layer, channel)
        raise


# the reply channels of requests whose renter went away during the database step
_abandoned: set[str] = set()


class EarlyOffer:
    """The request step's early offer (``services.job_open_by_key_async``'s
    ``offer_now``): the offer of a claimed slot leaves for its machine as soon
    as the database answered, before the job's objects and coroutine are built
    (they are built while the host starts: off the time to first token,
    docs/performance.md). The replies that come before the job's coroutine
    reads its channel are held for it (``ballast.local.reader_hold``), so they
    keep their order.
    """

    def __init__(self, channel: str) -> None:
        """``channel``: the job's reply channel (``job_channel_open``)."""
        self.channel = channel
        self.sent: tuple[str, str] | None = None  # (machine channel, attempt id)
        # a guessed offer's answer for its machine's connection: True once the
        # claim took the guessed device, False when withdrawn (guess_send)
        self.confirmed: asyncio.Future | None = None
        self.guessed: tuple[str, str] | None = None  # (machine channel, attempt id)

    async def send(self, machine_channel: str, attempt_id: str, frame: dict) -> bool:
        """Send the offer ``frame`` of attempt ``attempt_id`` to its machine's
        connection, and let that connection write it before the caller goes on;
        False (nothing sent) when the renter went away already. Raises what
        ``local.channel_send`` raises."""
        if self.channel in _abandoned:
            return False
        await self._offer_send(
            machine_channel, _offer_message(attempt_id, self.channel, frame)
        )
        self.sent = (machine_channel, attempt_id)
        return True

    async def _offer_send(self, machine_channel: str, message: dict) -> None:
        """Hold the job's replies for its coroutine, send the offer ``message``
        and let the connection's handler write it before the caller goes on."""
        local.reader_hold(self.channel)
        await local.channel_send(get_channel_layer(), machine_channel, message)
        await asyncio.sleep(0)  # the connection's handler writes the frame now

    async def guess_send(
        self, machine_channel: str, attempt_id: str, frame: dict
    ) -> bool:
        """Send the offer ``frame`` before the request's database step answered,
        to the device its claim is expected to take (``services.job_open_by_key_async``);
        its machine's connection must read here (``local.reads_here``): it
        relays the host's frames to the job's channel as for any offer (held
        until the job's coroutine reads), but records the host's claim only once
        ``guess_confirm`` says the step claimed that device. False (nothing
        sent) when the renter went away already or the connection is gone."""
        if self.channel in _abandoned or not local.reads_here(machine_channel):
            return False
        self.confirmed = asyncio.get_running_loop().create_future()
        message = _offer_message(attempt_id, self.channel, frame)
        message["confirmed"] = self.confirmed
        await self._offer_send(machine_channel, message)
        self.guessed = (machine_channel, attempt_id)
        return True

    def guess_confirm(self) -> None:
        """The step claimed the guessed device: the offer stands (``sent``)."""
        if self.confirmed is not None and not self.confirmed.done():
            self.confirmed.set_result(True)
        self.sent, self.guessed = self.guessed, None

    async def guess_withdraw(self) -> None:
        """The step did not claim the guessed device (or failed): cancel the
        guessed offer on its host. The host's frames for it are then dropped by
        its connection, and any already relayed carry an attempt id the job
        never stores, so its coroutine passes over them. Failures are logged."""
        if self.confirmed is not None and not self.confirmed.done():
            self.confirmed.set_result(False)
        guessed, self.guessed = self.guessed, None
        if guessed is not None:
            await _offer_cancel(*guessed)

    async def cancel(self) -> None:
        """Tell the machine to drop the offer, when one was sent (the step failed
        after it), and a guessed offer not confirmed. Failures are logged."""
        await self.guess_withdraw()
        if self.sent is not None:
            await _offer_cancel(*self.sent)


def _offer_message(attempt_id: str, reply: str, frame: dict) -> dict:
    """The message that has a machine's connection send ``frame`` (an ``offer``
    for attempt ``attempt_id``) and relay its replies to channel ``reply``."""
    return {
        "type": "attempt.offer",
        "attempt": attempt_id,
        "reply": reply,
        "frame": frame,
    }


def _cancel_message(attempt_id: str) -> dict:
    """The message that has a machine's connection tell its host to stop."""
    return {"type": "attempt.cancel", "attempt": attempt_id}


async def _offer_cancel(machine_channel: str, attempt_id: str) -> None:
    try:
        await local.channel_send(
            get_channel_layer(),
            machine_channel,
            _cancel_message(attempt_id),
        )
    except Exception:
        log.exception("attempt %s: cancelling its offer failed", attempt_id)


async def _job_abandon(step: asyncio.Future) -> None:
    """Wait for a request's database step whose renter went away; close the job
    it stored (its result's first item), if any. Failures are logged."""
    try:
        opened = await step
    except BaseException:  # refused or failed: nothing stored
        return
    job, dispatch = opened[0], opened[-1]
    if isinstance(dispatch, services.Dispatch) and dispatch.offered:
        await _offer_cancel(dispatch.machine_channel, str(dispatch.attempt.id))
    try:
        await db_call_retried(services.job_finish)(
            job_id=str(job.id),
            status=Job.Status.CANCELLED,
            output_text="",
            error_code="cancelled",
            error_message="the renter disconnected before the job started",
        )
    except Exception:
        log.exception("job %s: closing it after the renter went away failed", job.id)
        return
    slots_announce_soon([job.model_id])


@dataclass
class Token:
    """A piece of output text delivered to the renter."""

    text: str


@dataclass
class Finished:
    """The job succeeded; ``usage`` is {prompt_tokens, completion_tokens, total_tokens}."""

    finish_reason: str
    usage: dict


@dataclass
class Failed:
    """The job failed. Before any output ``status`` is the HTTP code to answer."""

    status: int
    code: str
    message: str
    after_output: bool
    usage: dict = field(default_factory=dict)


@dataclass
class _Segment:
    attempt: Attempt
    machine_channel: str
    pieces: list[str] = field(default_factory=list)
    outcome: str = ""
    error: str = ""
    done: dict | None = None
    claimed_at: datetime | None = None
    first_token_at: datetime | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class JobRun:
    """Run one stored job; iterate ``events()`` for Token / Finished / Failed.

    Closing the iterator early (the renter went away) cancels the job: the host is
    told to stop, the slot frees, and the renter is billed for what was delivered
    (DESIGN.md "Money": what the renter received). With ``whole_at_end`` (a
    non-streamed response) the renter receives the text only with the job's last
    event, so a renter who goes away before it received nothing and is billed
    nothing, whatever the hosts generated.
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
        """``model``, ``channel`` (made by the layer's ``new_channel``, so replies to
        it are kept from the start) and the first ``dispatch`` may come from the
        request path's single database step (``services.job_open``); what is not
        given is fetched or made when ``events()`` starts. ``whole_at_end``: the
        renter gets the answer in one response with the last event (see the
        class docstring), not piece by piece as the tokens are yielded."""
        self.job = job
        self.whole_at_end = whole_at_end
        self.job_id = str(job.id)
        self.layer = get_channel_layer()
        self.channel = channel
        self.model = model
        self.first_dispatch = dispatch
        self.delivered: list[str] = []
        self.segment: _Segment | None = None
        # the UTF-8 bytes of ``delivered`` (the cheap bound of ``_within_max_tokens``)
        # and (bytes, tokens) of the answer at the tokenizer's last count
        self.delivered_bytes = 0
        self.token_mark = (0, 0)
        self.finished = False
        # the end of an answer the host completed (``_succeed``), and the record
        # of a failed attempt's end (``_end_segment``) in flight: once begun each
        # runs to its end whatever happens to the request (``_cancel`` waits)
        self.ending: asyncio.Future | None = None
        self.segment_ending: asyncio.Future | None = None
        self.inbox_chars = 0  # text of the token messages delivered locally, waiting

    @property
    def delivered_text(self) -> str:
        return "".join(self.delivered)

    async def events(self) -> AsyncIterator[Token | Finished | Failed]:
        """Yield the job's events until it ends; see the class docstring."""
        if not self.channel:
            self.channel = await self.layer.new_channel("job.")
        if self.model is None:
            self.model = await db_call(CatalogModel.objects.get)(id=self.job.model_id)
        self.inbox: deque[dict] = deque()
        self.arrived = asyncio.Event()
        reader = asyncio.create_task(self._read_channel())
        lease = asyncio.create_task(self._keep_lease())
        for message in local.reader_add(self.channel, self._deliver):
            self._deliver(message)  # replies to an early offer, held till now
        failure: Exception | None = None
        try:
            async for event in self._run():
                yield event
        except Exception as exc:  # the coordinator's own failure, not the renter's
            failure = exc
            raise
        finally:
            local.reader_remove(self.channel, self._deliver)
            lease.cancel()
            try:
                if not self.finished:
                    await asyncio.shield(self._cancel(failure))
            finally:
                reader.cancel()

    async def _read_channel(self) -> None:
        """Move every message of the job's channel into ``inbox``.

        One receive stays pending for the job's whole life: cancelling a channel
        layer's ``receive`` (as a timeout would) can drop the subscription of the
        Redis pub/sub layer, so deadlines wait on the inbox instead.
        """
        while True:
            self.inbox.append(await self.layer.receive(self.channel))
            self.arrived.set()

    def _deliver(self, message: dict) -> None:
        """Take a message sent from this process (``ballast.local``) into ``inbox``.

        A token right after a token of the same attempt joins its text (what
        ``_more_text`` would do when reading), so a fast host and a slow renter
        cost one message, not one per frame. Raises ChannelFull, as the layer
        would, when more than ``LOCAL_INBOX_CHARS`` of text waits unread: the
        host's connection then closes and the job fails over. An honest host
        never gets there: it stops at ``max_tokens``, far below the bound even
        for a renter who stopped reading; a host that streams past it is cut off.
        """
        inbox = self.inbox
        if message.get("type") == "host.token":
            text = message["text"]
            if self.inbox_chars + len(text) > LOCAL_INBOX_CHARS:
                raise ChannelFull(
                    f"{self.channel}: {self.inbox_chars} characters unread"
                )
            self.inbox_chars += len(text)
            last = inbox[-1] if inbox else None
            if (
                last is not None
                and last.get("local")
                and last.get("attempt") == message.get("attempt")
            ):
                last["text"] += text
                return
            message["local"] = True
        inbox.append(message)
        self.arrived.set()

    async def _next_message(self, timeout: float) -> dict:
        """The next message of the job's channel; raises TimeoutError after ``timeout`` s.

        A message already waiting is returned without suspending; otherwise one timer
        (``asyncio.timeout``), not a task per message as ``wait_for`` would make.
        """
        if not self.inbox:
            self.arrived.clear()
            async with asyncio.timeout(timeout):
                await self.arrived.wait()
        return self._take()

    def _take(self) -> dict:
        """Pop the inbox's first message (a local token frees its text's bound)."""
        message = self.inbox.popleft()
        if message.get("local"):
            self.inbox_chars -= len(message["text"])
        return message

    def _more_text(self, attempt_id: str) -> str:
        """Text of the token frames of this attempt already waiting in the inbox.

        Tokens that arrived together go to the renter as one chunk: fewer events,
        same text (DESIGN.md: a token may be any length ≥ 1 character).
        """
        inbox = self.inbox
        pieces = []
        while inbox:
            head = inbox[0]
            if head.get("type") != "host.token" or head.get("attempt") != attempt_id:
                break
            pieces.append(self._take()["text"])
        return "".join(pieces)

    async def _keep_lease(self) -> None:
        while True:
            await asyncio.sleep(services.JOB_LEASE_S / 3)
            await db_call(services.job_lease_renew)(job_id=self.job_id)

    async def _run(self) -> AsyncIterator[Token | Finished | Failed]:
        loop = asyncio.get_running_loop()
        queue_deadline = loop.time() + settings.BALLAST_QUEUE_TIMEOUT_S
        failures_before_output = 0
        continuation_used = False
        waited = False  # the job waited in the queue for a slot
        while True:
            continue_from = self.delivered_text
            if continue_from and loop.time() > queue_deadline:
                queue_deadline = loop.time() + settings.BALLAST_CLAIM_TIMEOUT_S
            dispatch, self.first_dispatch = self.first_dispatch, None
            if dispatch is not None and dispatch.wait:
                # made in the transaction that stored the job: a slot that freed
                # before that commit announced itself to nobody (the job was not
                # visible yet), so look once more before waiting for a wake-up
                dispatch = None
            if dispatch is None:  # once more on a failed connection, as the end
                dispatch = await db_call_retried(services.job_dispatch)(
                    job_id=self.job_id,
                    continue_from=continue_from,
                    waiting_channel=self.channel,
                    job=self.job,
                    model=self.model,
                )
            if dispatch.exhausted:
                if continue_from:
                    yield await self._fail(
                        502,
                        "continuation_failed",
                        "no other device can continue the answer",
                    )
                else:
                    yield await self._fail(
                        502,
                        "all_attempts_failed",
                        f"{failures_before_output} attempt(s) failed before any output "
                        "and no other device can serve the request; nothing was billed",
                    )
                return
            if dispatch.impossible:
                if continue_from:  # the renter has part of the answer already
                    yield await self._fail(
                        502,
                        "continuation_failed",
                        "the host stopped mid-answer and no other device can "
                        f"continue it ({dispatch.impossible})",
                    )
                elif failures_before_output:  # PROTOCOL.md: 502, not "no device"
                    yield await self._fail(
                        502,
                        "all_attempts_failed",
                        f"{failures_before_output} attempt(s) failed before any "
                        f"output and no other device can serve the request "
                        f"({dispatch.impossible}); nothing was billed",
                    )
                else:
                    yield await self._fail(503, "no_capacity", dispatch.impossible)
                return
            if dispatch.contended and loop.time() < queue_deadline:
                await asyncio.sleep(random.uniform(0.001, 0.01))  # its row frees in ms
                continue
            if dispatch.wait:
                remaining = queue_deadline - loop.time()
                if remaining <= 0:
                    if continue_from:
                        yield await self._fail(
                            502,
                            "continuation_failed",
                            "no device took the continuation",
                        )
                    else:
                        yield await self._fail(
                            504,
                            "queue_timeout",
                            f"no device took the request for model "
                            f"'{self.job.model_id}' within "
                            f"{settings.BALLAST_QUEUE_TIMEOUT_S:g} s (all busy or unavailable)",
                            job_status=Job.Status.TIMED_OUT,
                        )
                    return
                await self._wait_for_slot(min(remaining, SLOT_POLL_S))
                waited = True
                continue
            if waited:
                # a queued job got a slot: wake the next ones, as there may be
                # more free slots (answers ending together wake the same oldest
                # two; a multi-slot device would otherwise fill up one poll at a
                # time). A woken job that finds none stops the chain.
                waited = False
                slots_announce_soon([self.job.model_id])
            segment = _Segment(
                attempt=dispatch.attempt, machine_channel=dispatch.machine_channel
            )
            self.segment = segment
            if not dispatch.offered:  # else the request step sent it (EarlyOffer)
                await local.channel_send(
                    self.layer,
                    dispatch.machine_channel,
                    _offer_message(
                        str(segment.attempt.id), self.channel, dispatch.offer
                    ),
                )
            async for piece in self._follow(segment):
                self.delivered.append(piece)
                yield Token(piece)
            if segment.outcome == Attempt.Outcome.SUCCEEDED:
                yield await self._succeed(segment)
                return
            await self._end_segment(segment)
            if self.job.target_device_id:
                # a spot check or a rental runs on its one device: no other to try
                yield await self._fail(
                    502,
                    segment.outcome,
                    f"the device failed the job ({segment.outcome})",
                )
                return
            if segment.pieces and not continuation_used:
                continuation_used = True
                log.info("job %s: continuation after %s", self.job_id, segment.outcome)
                continue
            if self.delivered:
                yield await self._fail(
                    502,
                    "continuation_failed" if continuation_used else segment.outcome,
                    f"the host stopped mid-answer ({segment.outcome}) and "
                    "the one continuation did not complete",
                )
                return
            failures_before_output += 1
            if failures_before_output >= settings.BALLAST_MAX_ATTEMPTS:
                yield await self._fail(
                    502,
                    "all_attempts_failed",
                    f"{failures_before_output} attempts failed before any output "
                    f"(last: {segment.outcome}); nothing was billed",
                )
                return

    async def _wait_for_slot(self, timeout: float) -> None:
        """Sleep until a slot of the model frees (a wake-up message) or ``timeout`` s."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            try:
                message = await self._next_message(left)
            except TimeoutError:
                return
            if message.get("type") == "slot.free":
                return

    async def _follow(self, segment: _Segment) -> AsyncIterator[str]:
        """Yield the attempt's text pieces; set ``segment.outcome`` when it ends."""
        loop = asyncio.get_running_loop()
        attempt_id = str(segment.attempt.id)
        deadline = loop.time() + settings.BALLAST_CLAIM_TIMEOUT_S
        timeout_outcome = Attempt.Outcome.CLAIM_TIMEOUT
        while True:
            left = deadline - loop.time()
            try:
                if left <= 0:
                    raise TimeoutError
                message = await self._next_message(left)
            except TimeoutError:
                log.debug("job %s: %s", self.job_id, timeout_outcome)
                segment.outcome = timeout_outcome
                segment.error = f"no frame within the deadline ({timeout_outcome})"
                return
            if message.get("attempt") != attempt_id:
                continue  # late frames of an earlier attempt, or a stray wake-up
            kind = message["type"]
            if kind == "host.claim":
                segment.claimed_at = timezone.now()  # the consumer records it too
                deadline = loop.time() + settings.BALLAST_FIRST_TOKEN_TIMEOUT_S
                timeout_outcome = Attempt.Outcome.FIRST_TOKEN_TIMEOUT
            elif kind == "host.token":
                if not segment.pieces:
                    segment.first_token_at = timezone.now()  # written when it ends
                text = message["text"] + self._more_text(attempt_id)
                text, over = self._within_max_tokens(segment, text)
                if text:
                    segment.pieces.append(text)
                    yield text
                if over:
                    # the host ignores max_tokens: end the answer at the limit, unpaid
                    segment.outcome = Attempt.Outcome.SUCCEEDED
                    segment.done = {
                        "finish_reason": "length",
                        "prompt_tokens": 0,
                        "completion_tokens": token_count(
                            self.job.model_id, segment.text
                        )
                        or 0,
                        "receipt": "",
                    }
                    await local.channel_send(
                        self.layer,
                        segment.machine_channel,
                        _cancel_message(attempt_id),
                    )
                    return
                deadline = loop.time() + settings.BALLAST_STALL_TIMEOUT_S
                timeout_outcome = Attempt.Outcome.STALLED
            elif kind == "host.done":
                if not segment.pieces:  # never an empty success (DESIGN.md)
                    segment.outcome = Attempt.Outcome.EMPTY_ANSWER
                    segment.error = "done without any output"
                else:
                    segment.outcome = Attempt.Outcome.SUCCEEDED
                    segment.done = message["done"]
                return
            elif kind in ("host.error", "host.gone"):
                segment.outcome = (
                    Attempt.Outcome.DIED_MIDSTREAM
                    if segment.pieces
                    else Attempt.Outcome.HOST_ERROR
                )
                segment.error = message.get("message", "")
                return

    def _within_max_tokens(self, segment: _Segment, text: str) -> tuple[str, bool]:
        """Cut ``text`` so the renter never receives more than ``max_tokens``.

        Returns (the part to deliver, whether the limit was passed); the part's
        UTF-8 bytes are added to ``delivered_bytes``. Cheap while the UTF-8
        bytes of the answer are within ``max_tokens``: every token of a byte-level
        BPE vocabulary is at least one byte (a character may be several tokens, a
        byte never is), so tokens(answer) <= tokens at the last count + bytes since
        (+1 at the seam). Past that, the model's tokenizer counts the whole answer
        (every segment: the continuation's too), and the longest prefix of
        ``text`` that fits is found by bisection.
        """
        limit = self.job.params.get("max_tokens")
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
        total = self.delivered_bytes + size
        marked_bytes, marked_tokens = self.token_mark
        if not limit or marked_tokens + (total - marked_bytes) + 1 <= limit:
            return self._relayed(text, size), False
        before = self.delivered_text
        count = token_count(self.job.model_id, before + text)
        if count is None:
            return self._relayed(text, size), False
        self.token_mark = (total, count)
        if count <= limit:
            return self._relayed(text, size), False
        low, high = 0, len(text)  # the longest prefix that still fits
        while low < high:
            mid = (low + high + 1) // 2
            if (token_count(self.job.model_id, before + text[:mid]) or 0) <= limit:
                low = mid
            else:
                high = mid - 1
        cut = text[:low]
        return self._relayed(cut, len(cut.encode("utf-8"))), True

    def _relayed(self, text: str, size: int) -> str:
        """Count ``text`` (``size`` UTF-8 bytes), passed on to the renter; return it.

        (The caller appends it to ``delivered``: ``_run``, before ``_follow`` is
        resumed for the next piece.)
        """
        self.delivered_bytes += size
        return text

    async def _end_segment(self, segment: _Segment) -> None:
        """End a failed or cancelled attempt: record it, tell the host, free the slot."""
        # sent again after a rollback that a second try gets past (a lost
        # prepared statement: the score's reads), not a 503 in place of a failover;
        # shielded: a renter going away meanwhile must not leave the attempt to
        # the job's close, which would end it with no text (``_cancel``)
        self.segment_ending = asyncio.ensure_future(
            db_call_retried(services.attempt_end, when=retry_worthy)(
                attempt_id=str(segment.attempt.id),
                outcome=segment.outcome,
                output_text=segment.text,
                error=segment.error,
                claimed_at=segment.claimed_at,
                first_token_at=segment.first_token_at,
            )
        )
        await asyncio.shield(self.segment_ending)
        await local.channel_send(
            self.layer,
            segment.machine_channel,
            _cancel_message(str(segment.attempt.id)),
        )
        slots_announce_soon([self.job.model_id])

    async def _succeed(self, segment: _Segment) -> Finished:
        """End the job as the success its host completed (``_success_end``) and
        return its last event. The end is shielded: a renter who goes away now
        has the answer already, and it is billed as delivered (``_cancel``
        waits for the end instead of closing the job as cancelled)."""
        job = await asyncio.shield(self._success_end(segment))
        self.finished = True
        return Finished(finish_reason=job.finish_reason, usage=_usage(job))

    def _success_end(self, segment: _Segment) -> asyncio.Future:
        """The task that ends the job as a success (made once): the end and
        the look-up of the queued jobs its slot wakes in one call, then their
        wake-up; its result is the ended job."""
        if self.ending is None:
            self.ending = asyncio.ensure_future(self._success_record(segment))
        return self.ending

    async def _success_record(self, segment: _Segment) -> Job:
        job, waiting = await db_call_retried(services.job_succeed_waking)(
            model_id=self.job.model_id,
            job_id=self.job_id,
            attempt_id=str(segment.attempt.id),
            segment_text=segment.text,
            done=segment.done,
            answer_text=self.delivered_text,
            claimed_at=segment.claimed_at,
            first_token_at=segment.first_token_at,
        )
        try:
            await slot_free_send(waiting)
        except Exception:  # the queued requests' fallback poll still runs
            log.exception("job %s: waking the queued requests failed", self.job_id)
        return job

    async def _fail(
        self,
        http_status: int,
        code: str,
        message: str,
        *,
        job_status: str = Job.Status.FAILED,
    ) -> Failed:
        job = await db_call_retried(services.job_finish)(
            job_id=self.job_id,
            status=job_status,
            output_text=self.delivered_text,
            finish_reason="error" if self.delivered else "",
            error_code=code,
            error_message=message,
        )
        self.finished = True
        return Failed(
            status=http_status,
            code=code,
            message=message,
            after_output=bool(self.delivered),
            usage=_usage(job),
        )

    async def _cancel(self, failure: Exception | None = None) -> None:
        """The renter went away (or, with ``failure``, the coordinator failed, a
        database error say): stop the host, free the slot, bill what was
        delivered (nothing with ``whole_at_end``: the response that would have
        carried it is never written); the job is cancelled, or failed naming the
        failure."""
        segment = self.segment
        if self.segment_ending is not None and not self.segment_ending.done():
            # a failed attempt's end is being recorded, with its text: let it land
            with contextlib.suppress(Exception):
                await self.segment_ending
        if segment is not None and segment.outcome == Attempt.Outcome.SUCCEEDED:
            # the host completed the answer and the renter has it: its end is
            # the success's (begun already, or begun here), not a cancel that
            # would leave the delivered text unbilled and its host unpaid
            try:
                await self._success_end(segment)
                self.finished = True
                return
            except Exception:  # closed below as the cancel or failure it is
                log.exception("job %s: ending the completed answer failed", self.job_id)
                segment.outcome = ""
        try:
            if segment is not None and not segment.outcome:
                segment.outcome = Attempt.Outcome.CANCELLED
                await self._end_segment(segment)
        except Exception:  # (the host's cancel may fail to send: still close the job)
            log.exception("job %s: ending the attempt after cancel failed", self.job_id)
        if failure is None:
            status, code, message = (
                Job.Status.CANCELLED,
                "cancelled",
                "the renter disconnected",
            )
        else:
            status, code = (
                Job.Status.FAILED,
                (
                    "database_unavailable"
                    if isinstance(failure, DatabaseError)
                    else "internal_error"
                ),
            )
            message = f"the coordinator failed: {failure}"[:500]
        try:
            await db_call_retried(services.job_finish)(
                job_id=self.job_id,
                status=status,
                output_text=self.delivered_text,
                error_code=code,
                error_message=message,
                received=not self.whole_at_end,
            )
        except Exception:  # never let cleanup errors escape a cancelled request
            log.exception("job %s: cleanup after cancel failed", self.job_id)
        self.finished = True


def _usage(job: Job) -> dict:
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": job.tokens_billed,
        "total_tokens": job.prompt_tokens + job.tokens_billed,
    }
