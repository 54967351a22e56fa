"""The job's side of the channel layer: its reply channel, the messages it sends
a machine's connection (offer, cancel), and the wake-ups of queued jobs when a
slot frees (DESIGN.md "How a request flows" steps 3–4, "No eligible device")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from channels.layers import get_channel_layer

from ballast import local
from ballast.db import db_call, db_call_durable

from .. import services
from ..models import Job

log = logging.getLogger("ballast.jobs")

T = TypeVar("T")


def offer_message(attempt_id: str, reply: str, frame: dict) -> dict:
    """The message that has a machine's connection send ``frame`` (an ``offer``
    for attempt ``attempt_id``) and relay its replies to channel ``reply``."""
    return {
        "type": "attempt.offer",
        "attempt": attempt_id,
        "reply": reply,
        "frame": frame,
    }


def cancel_message(attempt_id: str, *, reply: str = "") -> dict:
    """The message that has a machine's connection tell its host to stop; with
    ``reply`` (the job's channel) the host's receipt over what it sent comes
    back there as ``host.cancelled`` (``JobRun._receipt_wait``)."""
    if reply:
        return {
            "type": "attempt.cancel",
            "attempt": attempt_id,
            "receipt": True,
            "reply": reply,
        }
    return {"type": "attempt.cancel", "attempt": attempt_id}


async def slots_announce(model_ids, *, slots: int = 1) -> None:
    """Wake the oldest requests queued for these models: capacity came.

    Wakes ``WOKEN_PER_SLOT × slots`` of them per model (oldest first, across
    every coordinator process), not all: a freed slot must not start a
    stampede of dispatches. A woken request that cannot use the slot leaves it
    to the next wake-up or to the fallback poll (``run.SLOT_POLL_S``).
    """
    for model_id in model_ids:
        channels = await db_call(services.jobs_waiting_channels)(
            model_id=model_id, limit=services.WOKEN_PER_SLOT * slots
        )
        await slots_wake(channels)


async def slots_wake(channels) -> None:
    """Tell the queued requests of ``channels`` a slot freed (``slot.free``)."""
    layer = get_channel_layer()
    for channel in channels:
        await local.channel_send(layer, channel, {"type": "slot.free"})


_announcements: set[asyncio.Task] = set()


def slots_announce_soon(model_ids) -> None:
    """``slots_announce`` in the background: the caller goes on at once.
    Failures are logged; the queued requests' fallback poll still runs."""
    _soon(slots_announce(list(model_ids)), f"announcing free slots of {model_ids}")


def slots_wake_soon(channels) -> None:
    """``slots_wake`` in the background, when there is any channel to wake
    (a job's end read them: ``services.job_succeed``). As ``slots_announce_soon``."""
    if channels:
        _soon(slots_wake(list(channels)), f"waking {len(channels)} queued jobs")


def _soon(step, what: str) -> None:
    task = asyncio.create_task(_logged(step, what))
    _announcements.add(task)
    task.add_done_callback(_announcements.discard)


async def _logged(step, what: str) -> None:
    try:
        await step
    except Exception:
        log.exception("%s failed", what)


async def job_channel_open(open_job: Callable[[str], Awaitable[T]]) -> tuple[str, T]:
    """Make a job's reply channel, then ``await open_job(channel)`` (the request's
    transaction, ``services.job_open``); return (channel, its result).

    The channel exists before the offer can go out, so no reply is lost. If
    ``open_job`` raises (an ApiError for a refused request, or anything else),
    the channel is given back and the error re-raised. If the caller is
    cancelled meanwhile (the renter went away), the transaction still ends (its
    own task, shielded) and what it stored is closed at once (the job
    cancelled, a claimed slot freed, nothing billed: ``_job_abandon``); then the
    cancellation goes on.
    """
    channel = await local.channel_new(get_channel_layer())
    step = asyncio.ensure_future(open_job(channel))
    try:
        return channel, await asyncio.shield(step)
    except asyncio.CancelledError:
        await asyncio.shield(_job_abandon(step))
        local.reader_drop(channel)
        raise
    except BaseException:
        local.reader_drop(channel)
        raise


async def _job_abandon(step: asyncio.Future) -> None:
    """Wait for a request's transaction whose renter went away; close the job it
    stored (its result's first item), if any. Failures are logged. (No offer
    has left: it goes out only from the job's coroutine.)"""
    try:
        opened = await step
    except BaseException:  # refused or failed: nothing stored
        return
    job = opened[0]
    try:
        await db_call_durable(services.job_finish)(
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
