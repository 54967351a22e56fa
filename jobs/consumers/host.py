"""The job relay on the host websocket (PROTOCOL.md §2; DESIGN.md "How a request
flows" steps 3–5): offers to the host, and the frames of its attempts (claim,
token, done, error) relayed to the coroutine that owns each job.

Frames of an attempt are relayed only while the attempt is open on *this*
connection; a token costs no database write. The spot checks due on the
machine and the verifications offered to it run on the same connection, added
by the checks' own consumer (``trust.consumers.MachineConsumer``, this one
extended: the socket ``ballast.asgi`` routes).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any


from ballast import local
from ballast.db import db_call
from hosts import protocol
from hosts.logprobs import TokenLogprobs
from hosts.consumers import HostConsumer
from hosts.services import HeartbeatResult

from .. import services
from ..orchestration import slots_announce

log = logging.getLogger("ballast.jobs")

# the replies to offers that came after their connection closed, in flight
_late_replies: set[asyncio.Task] = set()
# how many cancelled attempts a connection remembers (HostRelayConsumer.cancelled)
CANCELLED_KEPT = 64
# the text a connection keeps of one attempt for its receipt (characters): past
# it the host's ``cancelled`` receipt is not checked (and not paid)
SENT_KEPT_CHARS = 1_000_000


def _no_receipt(attempt_id: str) -> dict:
    """The answer to a job waiting for a cancel receipt that will not come."""
    return {"type": "host.cancelled", "attempt": attempt_id, "cancelled": None}


def _host_gone(attempt_id: str) -> dict:
    """The message that tells a job its attempt's host connection closed."""
    return {
        "type": "host.gone",
        "attempt": attempt_id,
        "message": "host connection closed",
    }


class HostRelayConsumer(HostConsumer):
    """A machine's connection with the frames of its attempts."""

    async def connect(self) -> None:
        # attempt id -> {"reply": channel of the job's coroutine, "claimed": bool}
        self.open_attempts: dict[str, dict[str, Any]] = {}
        # the last attempts cancelled here: the host's frames of them that cross
        # the cancel are dropped without an error; attempt id -> its info while
        # the host's ``cancelled`` (its receipt) is awaited, else None
        self.cancelled: collections.OrderedDict[str, dict | None] = (
            collections.OrderedDict()
        )
        await super().connect()

    async def connection_closed(self) -> None:
        for attempt_id, info in list(self.open_attempts.items()):
            await local.channel_send(
                self.channel_layer, info["reply"], _host_gone(attempt_id)
            )
        self.open_attempts.clear()
        for attempt_id, info in list(self.cancelled.items()):
            if info is not None and info.get("receipt_wanted"):
                await local.channel_send(
                    self.channel_layer, info["reply"], _no_receipt(attempt_id)
                )
        self.cancelled.clear()

    def undelivered(self, message: dict) -> None:
        """An offer that reached this connection after it closed (a dispatch
        picked the machine as it went away): the job is told at once that the
        host is gone, and moves on, rather than waiting out its claim deadline
        (DESIGN.md: 5 s). Offers from other coordinator processes still come
        through the layer and wait it out."""
        if message.get("type") == "attempt.offer":
            reply = local.channel_send(
                self.channel_layer, message["reply"], _host_gone(message["attempt"])
            )
            task = asyncio.get_running_loop().create_task(reply)
            _late_replies.add(task)
            task.add_done_callback(_late_replies.discard)

    async def heartbeat_stored(self, result: HeartbeatResult) -> None:
        """Capacity came: wake the queued requests."""
        if result.models_with_capacity:
            await slots_announce(result.models_with_capacity, slots=result.slots_gained)

    def _open(self, frame: dict) -> tuple[str, dict | None]:
        attempt_id = protocol.parse_job_frame(frame)
        return attempt_id, self.open_attempts.get(attempt_id)

    async def frame_claim(self, frame: dict) -> None:
        attempt_id, info = self._open(frame)
        if info is None or info["claimed"]:
            await self._stray_frame(
                attempt_id,
                f"claim: job {attempt_id[:40]} is not offered to this machine",
            )
            return
        # the offer reached this connection and the attempt is still open on it:
        # relay the claim at once; it is recorded once the first token is relayed
        # (``frame_token``): the agent streams right after its claim, and a
        # database step beside the first token (a thread holding the GIL) costs it
        # ~0.1 ms. Without a token the job's coroutine records the claim with the
        # attempt's end (``claimed_at``).
        info["claimed"] = True
        await local.channel_send(
            self.channel_layer,
            info["reply"],
            {"type": "host.claim", "attempt": attempt_id},
        )

    async def _claim_record(self, attempt_id: str) -> None:
        """Record a relayed claim (compare-and-set offered → claimed); when the
        attempt was ended meanwhile, stop the host (its frames are no longer
        relayed)."""
        try:
            claimed = await db_call(services.attempt_claim)(
                attempt_id=attempt_id, machine_id=self.machine_id
            )
        except Exception:
            log.exception("claim of %s on machine %s", attempt_id, self.machine_name)
            return
        if not claimed and attempt_id in self.open_attempts:
            # ended meanwhile (its job's cancel may still be on its way): its
            # frames already sent cross this cancel and are dropped quietly
            await self._attempt_drop(attempt_id)

    async def frame_token(self, frame: dict) -> None:
        """Relay a token to the job's coroutine, in order, without waiting for the layer.

        The text goes to the attempt's outbox; one relay task per attempt sends what
        is waiting there as one ``host.token`` message (a token may be any length
        >= 1 character, PROTOCOL.md §2), so frames that arrive while the channel
        layer is busy (a Redis round trip) are merged instead of queueing one round
        trip each. ``done``, ``error`` and the connection's end wait for the outbox,
        so they never overtake a token.
        """
        attempt_id, info = self._open(frame)
        text = await self._parsed(protocol.parse_token, frame, attempt_id, info)
        if info is None and self.cancelled.get(attempt_id) is not None:
            _sent_add(self.cancelled[attempt_id], text)  # crossed the cancel
            return
        if info is None or not info["claimed"]:
            await self._stray_frame(
                attempt_id,
                f"token: job {attempt_id[:40]} is not claimed on this machine",
            )
            return
        if info.get("relay_failed"):
            return  # never relay a token after a lost one: the connection is closing
        if "logprobs" in info:  # the offer asked for them: every frame has them
            parse = info["logprobs"].parse
            entries = await self._parsed(parse, frame, attempt_id, info)
            info["logprobs_outbox"].extend(entries)
        _sent_add(info, text)
        outbox = info.get("outbox")
        if outbox is None:
            outbox = info["outbox"] = []
        outbox.append(text)
        relay = info.get("relay")
        if relay is None or relay.done():
            info["relay"] = asyncio.create_task(self._tokens_relay(attempt_id, info))
        if relay is None:  # the attempt's first token: now record its claim
            info["relay"].add_done_callback(
                lambda _: self._claim_record_soon(attempt_id)
            )

    def _claim_record_soon(self, attempt_id: str) -> None:
        task = asyncio.create_task(self._claim_record(attempt_id))
        self.background_tasks.add(task)
        task.add_done_callback(self.background_tasks.discard)

    async def _tokens_relay(self, attempt_id: str, info: dict) -> bool:
        """Send the attempt's outbox until it is empty; False if the layer failed.

        A failure (``ChannelFull``, Redis gone) ends this connection (code 1011, as an
        exception in a handler would): the job then sees the host go and fails over.
        """
        outbox = info["outbox"]
        try:
            while outbox:
                text = outbox[0] if len(outbox) == 1 else "".join(outbox)
                outbox.clear()
                message = {
                    "type": "host.token",
                    "attempt": attempt_id,
                    "text": text,
                    "at": info.get("relayed_chars", 0),
                }
                if "logprobs" in info:
                    message["logprobs"] = info["logprobs_outbox"]
                    info["logprobs_outbox"] = []
                await local.channel_send(self.channel_layer, info["reply"], message)
                info["relayed_chars"] = info.get("relayed_chars", 0) + len(text)
        except Exception:
            log.exception(
                "machine %s: relaying tokens of %s failed",
                self.machine_name,
                attempt_id,
            )
            info["relay_failed"] = True
            outbox.clear()
            await self.close(code=1011)
            return False
        return True

    async def _tokens_relayed(self, info: dict) -> bool:
        """Wait until every token of the attempt is relayed; False if relaying failed."""
        relay = info.get("relay")
        if relay is None:
            return True
        return await asyncio.shield(relay)

    async def websocket_disconnect(self, message: dict) -> None:
        """The connection ended: relay the tokens still in outboxes, then ``disconnect``."""
        for info in list(getattr(self, "open_attempts", {}).values()):
            await self._tokens_relayed(info)
        await super().websocket_disconnect(message)

    async def frame_done(self, frame: dict) -> None:
        attempt_id, info = self._open(frame)
        done = await self._parsed(protocol.parse_done, frame, attempt_id, info)
        if info is None and self.cancelled.get(attempt_id) is not None:
            # the host finished as the cancel crossed: its receipt is as good
            await self._receipt_relay(attempt_id, done)
            return
        if info is None or not info["claimed"]:
            await self._stray_frame(
                attempt_id,
                f"done: job {attempt_id[:40]} is not claimed on this machine",
            )
            return
        await self._attempt_last(
            attempt_id, info, {"type": "host.done", "attempt": attempt_id, "done": done}
        )

    async def frame_error(self, frame: dict) -> None:
        message = protocol.parse_error_message(frame)
        job = frame.get("job")
        if not isinstance(job, str):
            log.info("machine %s reported an error: %s", self.machine_name, message)
            return
        info = self.open_attempts.get(job)
        if info is None:
            await self.error_unopened(job, message)
            return  # an error for a job that already ended changes nothing
        await self._attempt_failed(job, info, message)

    async def error_unopened(self, job: str, message: str) -> None:
        """An ``error`` frame naming ``job``, no attempt open here: nothing to
        end (a subclass may have offered it something else of that id)."""

    async def _parsed(self, parse, frame: dict, attempt_id: str, info: dict | None):
        """``parse(frame)``; a malformed frame for an attempt open here ends that
        attempt as the host's error (DESIGN.md "Money": every way an offered
        attempt ends without an answer counts against the device), then raises
        the FrameError (the host gets an ``error`` frame)."""
        try:
            return parse(frame)
        except protocol.FrameError as exc:
            if info is not None:
                await self._attempt_failed(attempt_id, info, f"malformed frame: {exc}")
            raise

    async def _attempt_failed(self, attempt_id: str, info: dict, message: str) -> None:
        """Close the attempt here and tell its job the host failed it (``message``)."""
        await self._attempt_last(
            attempt_id,
            info,
            {"type": "host.error", "attempt": attempt_id, "message": message},
        )

    async def _attempt_last(self, attempt_id: str, info: dict, last: dict) -> None:
        """Close the attempt on this connection and relay its ``last`` message
        (``host.done`` or ``host.error``) after the tokens already taken."""
        self.open_attempts.pop(attempt_id, None)
        if not await self._tokens_relayed(info):
            return
        await local.channel_send(self.channel_layer, info["reply"], last)

    async def frame_cancelled(self, frame: dict) -> None:
        """The host's answer to a ``cancel``: its usage and a receipt over the
        text it sent for the job, relayed to the job's coroutine (which pays
        the host for the part the renter received, ``services.attempt_end``)."""
        attempt_id = protocol.parse_job_frame(frame)
        cancelled = protocol.parse_cancelled(frame)
        if attempt_id not in self.cancelled:
            await self.send_error(
                f"cancelled: job {attempt_id[:40]} was not cancelled on this machine"
            )
            return
        if self.cancelled[attempt_id] is not None:
            await self._receipt_relay(attempt_id, cancelled)

    async def _receipt_relay(self, attempt_id: str, answer: dict) -> None:
        """Relay the first receipt answer (``cancelled`` or a ``done`` that
        crossed the cancel) of a cancelled attempt, with the exact text its
        host sent; later ones change nothing."""
        info = self.cancelled[attempt_id]
        self.cancelled[attempt_id] = None
        if not info.get("receipt_wanted"):
            return
        sent = None if info.get("sent_overflow") else "".join(info.get("sent", ()))
        await local.channel_send(
            self.channel_layer,
            info["reply"],
            {
                "type": "host.cancelled",
                "attempt": attempt_id,
                "cancelled": {
                    "prompt_tokens": answer["prompt_tokens"],
                    "completion_tokens": answer["completion_tokens"],
                    "receipt": answer["receipt"],
                    "text": sent,
                },
            },
        )

    # --- messages from the job coroutines (channel layer) -----------------------------
    async def attempt_offer(self, message: dict) -> None:
        """Send an ``offer`` to the host and open the attempt on this connection."""
        info: dict[str, Any] = {"reply": message["reply"], "claimed": False}
        top = message["frame"].get("logprobs")
        if top is not None:  # its frames' logprobs checked, then relayed
            info.update(logprobs=TokenLogprobs(top), logprobs_outbox=[])
        self.open_attempts[message["attempt"]] = info
        await self.send_json(message["frame"])

    async def attempt_cancel(self, message: dict) -> None:
        """Tell the host to stop an attempt; later frames of it are ignored.

        Sent for every failed or cancelled attempt, even one the host itself
        reported as failed, so a host never keeps generating for nobody. With
        ``receipt`` (the coordinator ended a segment the renter received part
        of), the host's ``cancelled`` is relayed to the job as
        ``host.cancelled``; an attempt not open here is answered at once with
        none.
        """
        attempt_id = message["attempt"]
        wanted = bool(message.get("receipt"))
        if not await self._attempt_drop(attempt_id, receipt_wanted=wanted) and wanted:
            await local.channel_send(
                self.channel_layer, message["reply"], _no_receipt(attempt_id)
            )

    async def _attempt_drop(self, attempt_id: str, *, receipt_wanted=False) -> bool:
        """Close an attempt on this connection and tell the host to stop it;
        True when it was open here (it is remembered among ``cancelled``)."""
        info = self.open_attempts.pop(attempt_id, None)
        if info is not None:
            info["receipt_wanted"] = receipt_wanted
            self.cancelled[attempt_id] = info
            while len(self.cancelled) > CANCELLED_KEPT:
                dropped, old = self.cancelled.popitem(last=False)
                if old is not None and old.get("receipt_wanted"):
                    await local.channel_send(
                        self.channel_layer, old["reply"], _no_receipt(dropped)
                    )
        await self.send_json({"type": "cancel", "job": attempt_id})
        return info is not None

    async def _stray_frame(self, attempt_id: str, error: str) -> None:
        """A frame for an attempt not open (or not claimed) on this connection:
        an ``error`` frame, unless this connection cancelled it lately."""
        if attempt_id not in self.cancelled:
            await self.send_error(error)


def _sent_add(info: dict, text: str) -> None:
    """Keep ``text`` among what the host sent for the attempt (for the receipt
    of a cancel), up to ``SENT_KEPT_CHARS``."""
    if info.get("sent_overflow"):
        return
    sent = info.setdefault("sent", [])
    info["sent_chars"] = info.get("sent_chars", 0) + len(text)
    if info["sent_chars"] > SENT_KEPT_CHARS:
        info["sent_overflow"] = True
        sent.clear()
        return
    sent.append(text)
