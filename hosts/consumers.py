"""The host websocket, ``ballast.host.v1`` (PROTOCOL.md §2).

One consumer per machine connection. Every frame is checked before it can change
anything: a malformed or unknown frame gets an ``error`` frame back and is
otherwise ignored, so one broken host never hurts another. Frames of an attempt
are relayed to the coroutine that owns the job (its reply channel) only while
the attempt is open on *this* connection; a token costs no database write.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from contextlib import aclosing
from typing import Any

from django.conf import settings
from django.utils import timezone

from ballast import local
from ballast.consumers import DirectDispatchConsumer
from ballast.db import db_call, db_call_retried, lock_conflict
from jobs import services as job_services
from jobs import spotchecks
from jobs.orchestration import JobRun, slots_announce

from . import liveness as liveness_lease
from . import protocol, services

log = logging.getLogger("ballast.hosts")

# the replies to offers that came after their connection closed, in flight
_late_replies: set[asyncio.Task] = set()
# how many cancelled attempts a connection remembers (HostConsumer.cancelled)
CANCELLED_KEPT = 64


def _host_gone(attempt_id: str) -> dict:
    """The message that tells a job its attempt's host connection closed."""
    return {
        "type": "host.gone",
        "attempt": attempt_id,
        "message": "host connection closed",
    }


CLOSE_UNAUTHORIZED = 4401
CLOSE_KEY_MISMATCH = 4403
CLOSE_PROTOCOL = 4400
MAX_FRAME_BYTES = 256 * 1024


def bearer_token(scope: dict) -> str:
    """The bearer token of the ``Authorization`` header of an ASGI scope, or ''."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            text = value.decode("latin-1").strip()
            if text[:7].lower() == "bearer ":
                return text[7:].strip()
    return ""


class HostConsumer(DirectDispatchConsumer):
    """A machine's connection: hello, heartbeats, and the frames of its attempts."""

    async def connect(self) -> None:
        machine = await db_call(services.machine_authenticate)(
            token=bearer_token(self.scope)
        )
        if machine is None:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        self.machine_id = str(machine.id)
        self.machine_name = machine.name
        self.greeted = False
        self.spot_check_tasks: set[asyncio.Task] = set()
        self.background_tasks: set[asyncio.Task] = set()
        # attempt id -> {"reply": channel of the job's coroutine, "claimed": bool}
        self.open_attempts: dict[str, dict[str, Any]] = {}
        # the last attempts cancelled here: the host's frames of them that cross
        # the cancel are dropped without an error (a withdrawn guessed offer's
        # whole answer may be on its way)
        self.cancelled: collections.deque[str] = collections.deque(
            maxlen=CANCELLED_KEPT
        )
        subprotocols = self.scope.get("subprotocols") or []
        await self.accept(
            subprotocol=protocol.PROTOCOL_NAME
            if protocol.PROTOCOL_NAME in subprotocols
            else None
        )

    def idle(self) -> bool:
        """Whether this connection is open, runs no attempt now and its host's
        last heartbeat did not say paused (a guessed offer goes only to an idle
        machine: its host has every slot free, so an offer the claim confirms is
        never refused for a busy slot)."""
        return (
            hasattr(self, "open_attempts")
            and not self.open_attempts
            and not self.disconnecting
            and not self.host_paused
        )

    disconnecting = False
    host_paused = False

    async def disconnect(self, code: int) -> None:
        self.disconnecting = True
        if not hasattr(self, "machine_id"):
            return
        memo = getattr(self, "heartbeat_memo", None)
        lease = getattr(self, "lease", None)
        if lease is not None:
            lease.leave(self.machine_id, self)
        await db_call(services.machine_disconnect)(
            machine_id=self.machine_id,
            channel_name=self.channel_name,
            last_heartbeat_at=memo.last_beat_at if memo else None,
        )
        for attempt_id, info in list(self.open_attempts.items()):
            await local.channel_send(
                self.channel_layer, info["reply"], _host_gone(attempt_id)
            )
        self.open_attempts.clear()

    def undelivered(self, message: dict) -> None:
        """An offer that reached this connection after it closed (a request step
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

    # --- frames from the host ---------------------------------------------------------
    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None
    ) -> None:
        if text_data is None or len(text_data) > MAX_FRAME_BYTES:
            await self.send_error("frames must be JSON text of at most 256 KiB")
            return
        try:
            frame = json.loads(text_data)
        except (ValueError, RecursionError):
            await self.send_error("frame is not valid JSON")
            return
        if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            await self.send_error("frame must be a JSON object with a string 'type'")
            return
        kind = frame["type"]
        handler = getattr(self, f"frame_{kind}", None) if kind.isidentifier() else None
        if handler is None:
            await self.send_error(f"unknown frame type {kind[:40]!r}")
            return
        if kind != "hello" and not self.greeted:
            await self.send_error("send hello first")
            return
        try:
            await handler(frame)
        except protocol.FrameError as exc:
            await self.send_error(str(exc))

    async def frame_hello(self, frame: dict) -> None:
        hello = protocol.parse_hello(frame)
        lease = await liveness_lease.process_lease()
        try:
            # sent again (up to twice) when chosen as a deadlock's victim: two
            # connections of one machine saying hello at once, each with a
            # heartbeat's or a claim's device locks, can meet (two agents on one
            # machine token)
            previous = await db_call_retried(
                services.machine_hello, tries=3, when=lock_conflict
            )(
                machine_id=self.machine_id,
                channel_name=self.channel_name,
                hello=hello,
                lease_id=lease.id,
            )
        except services.KeyMismatch as exc:
            await self.send_error(str(exc))
            await self.close(code=CLOSE_KEY_MISMATCH)
            return
        if previous and previous != self.channel_name:
            # one connection per machine: the newer one wins, the older is closed
            await local.channel_send(
                self.channel_layer, previous, {"type": "machine.replaced"}
            )
        self.greeted = True
        self.heartbeat_memo = services.HeartbeatMemo()
        self.liveness_lock = asyncio.Lock()
        self.heartbeat_tasks: set[asyncio.Task] = set()
        self.lease = lease
        lease.join(self.machine_id, self)
        self.vram_needs_mb = await db_call(services.catalog_vram_needs_mb)()
        self.catalog_ids = await db_call(services.catalog_model_ids)()
        await self.send_json(
            {
                "type": "welcome",
                "machine_id": self.machine_id,
                "heartbeat_interval_s": services.heartbeat_interval_s(),
            }
        )

    async def frame_heartbeat(self, frame: dict) -> None:
        """Check a heartbeat; write to the database only what changed (coalesced).

        Steady heartbeats cost no database write: the time is kept in memory and
        the process lease vouches for the machine (``hosts.liveness``); liveness is
        written when the machine is marked stale (first heartbeat, or after a stale
        mark) or its pause flag changes, telemetry on a change that matters to
        eligibility (``hosts.services.heartbeat_changes``).
        """
        heartbeat = protocol.parse_heartbeat(frame)
        self.host_paused = heartbeat["paused"]
        now = timezone.now()
        memo = self.heartbeat_memo
        memo.last_beat_at = now
        liveness, reports = services.heartbeat_changes(
            memo=memo, heartbeat=heartbeat, now=now, vram_needs_mb=self.vram_needs_mb
        )
        if not (liveness or reports):
            return
        # written in the background: later frames (and their times) are not held up
        # behind a write, so a backlog of writes never makes a live machine look silent
        task = asyncio.create_task(self._heartbeat_store(heartbeat, now))
        self.heartbeat_tasks.add(task)
        task.add_done_callback(self.heartbeat_tasks.discard)

    async def _heartbeat_store(self, heartbeat: dict, now) -> None:
        """Write what a heartbeat received at ``now`` changed.

        At most ``HEARTBEAT_WRITES`` per process at once (``write_gate``, first come
        first served); the write itself holds the connection's ``liveness_lock``,
        which a lease tick that must mark the machine stale waits for (one database
        call, never the queue). What to write is decided under that lock, against
        what the writes before this one left (never an older heartbeat over a newer
        one), and an un-mark only while the heartbeat is younger than
        ``stale_after_s`` at that moment (``hosts.liveness``).
        """
        memo = self.heartbeat_memo
        try:
            async with self.lease.write_gate, self.liveness_lock:
                liveness, reports = services.heartbeat_changes(
                    memo=memo,
                    heartbeat=heartbeat,
                    now=now,
                    vram_needs_mb=self.vram_needs_mb,
                )
                reports = [
                    r
                    for r in reports
                    if memo.written_at.get(r["index"]) is None
                    or memo.written_at[r["index"]] <= now
                ]
                if memo.recorded_at is not None and memo.recorded_at > now:
                    liveness = False  # a newer heartbeat was recorded already
                if (
                    liveness
                    and memo.stale
                    and (timezone.now() - now).total_seconds()
                    > liveness_lease.stale_after_s()
                ):
                    liveness = False  # too old to un-mark by now; the next one will
                if not (liveness or reports):
                    return
                result = await db_call(services.machine_heartbeat)(
                    machine_id=self.machine_id,
                    heartbeat={"paused": heartbeat["paused"], "devices": reports},
                    now=now,
                    liveness=liveness,
                    channel_name=self.channel_name,
                )
                services.heartbeat_memo_update(
                    memo,
                    liveness=liveness,
                    paused=heartbeat["paused"],
                    reports=reports,
                    now=now,
                )
            if result.models_with_capacity:
                await slots_announce(
                    result.models_with_capacity, slots=result.slots_gained
                )
            await self._spot_checks_start()
        except Exception:
            log.exception("heartbeat of machine %s not stored", self.machine_name)

    def spot_checks_poke(self) -> None:
        """Take this machine's due spot checks soon (called by the lease loop)."""
        task = asyncio.create_task(self._spot_checks_start())
        self.spot_check_tasks.add(task)
        task.add_done_callback(self.spot_check_tasks.discard)

    async def _spot_checks_start(self) -> None:
        """Run the spot checks due on this machine's devices (a compare-and-set takes each)."""
        if not settings.BALLAST_SPOT_CHECKS:
            return  # (no thread hop for nothing on every written heartbeat)
        for job in await db_call(spotchecks.spot_checks_take_due)(
            machine_id=self.machine_id
        ):
            task = asyncio.create_task(self._spot_check_run(job))
            self.spot_check_tasks.add(task)
            task.add_done_callback(self.spot_check_tasks.discard)

    async def _spot_check_run(self, job) -> None:
        """Run a due spot check through the ordinary job path, then judge it."""
        try:
            async with aclosing(JobRun(job).events()) as events:
                async for _ in events:
                    pass
            await db_call(spotchecks.spot_check_judge)(job_id=str(job.id))
        except Exception:
            log.exception(
                "spot check %s on machine %s failed to run", job.id, self.machine_name
            )

    def _catalog_model(self, frame_type: str, model_id: str) -> None:
        """Refuse a report about a model that is not in the catalog (bounded rows)."""
        if model_id not in self.catalog_ids:
            raise protocol.FrameError(
                f"{frame_type}: model {model_id[:100]!r} is not in the catalog"
            )

    async def frame_model_load_failed(self, frame: dict) -> None:
        report = protocol.parse_model_load_failed(frame)
        self._catalog_model("model_load_failed", report["model"])
        await db_call(services.capability_failed_record)(
            machine_id=self.machine_id, report=report
        )

    async def frame_benchmark(self, frame: dict) -> None:
        report = protocol.parse_benchmark(frame)
        self._catalog_model("benchmark", report["model"])
        saved = await db_call(services.benchmark_record)(
            machine_id=self.machine_id, report=report
        )
        if saved is None:
            await self.send_error(f"benchmark: unknown device {report['device']}")

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

    async def _claim_record(
        self, attempt_id: str, confirmed: asyncio.Future | None = None
    ) -> None:
        """Record a relayed claim (compare-and-set offered → claimed); when the
        attempt was ended meanwhile, stop the host (its frames are no longer relayed).
        ``confirmed``: a guessed offer's (``EarlyOffer.guess_send``): its attempt
        is stored only if the request step claims this device, so the record
        waits for that answer, and a withdrawn guess records nothing (its
        cancel comes from the job's side)."""
        if confirmed is not None and not await confirmed:
            return
        try:
            claimed = await db_call(job_services.attempt_claim)(
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
        text = protocol.parse_token(frame)
        if info is None or not info["claimed"]:
            await self._stray_frame(
                attempt_id,
                f"token: job {attempt_id[:40]} is not claimed on this machine",
            )
            return
        if info.get("relay_failed"):
            return  # never relay a token after a lost one: the connection is closing
        outbox = info.get("outbox")
        if outbox is None:
            outbox = info["outbox"] = []
        outbox.append(text)
        relay = info.get("relay")
        if relay is None or relay.done():
            info["relay"] = asyncio.create_task(self._tokens_relay(attempt_id, info))
        if relay is None:  # the attempt's first token: now record its claim
            relay = info["relay"]
            confirmed = info.get("confirmed")
            relay.add_done_callback(
                lambda _: self._claim_record_soon(attempt_id, confirmed)
            )

    def _claim_record_soon(
        self, attempt_id: str, confirmed: asyncio.Future | None = None
    ) -> None:
        task = asyncio.create_task(self._claim_record(attempt_id, confirmed))
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
                await local.channel_send(
                    self.channel_layer,
                    info["reply"],
                    {"type": "host.token", "attempt": attempt_id, "text": text},
                )
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
        done = protocol.parse_done(frame)
        if info is None or not info["claimed"]:
            await self._stray_frame(
                attempt_id,
                f"done: job {attempt_id[:40]} is not claimed on this machine",
            )
            return
        self.open_attempts.pop(attempt_id, None)
        if not await self._tokens_relayed(info):
            return
        await local.channel_send(
            self.channel_layer,
            info["reply"],
            {"type": "host.done", "attempt": attempt_id, "done": done},
        )

    async def frame_error(self, frame: dict) -> None:
        message = frame.get("message")
        message = message[:2000] if isinstance(message, str) else ""
        job = frame.get("job")
        if not isinstance(job, str):
            log.info("machine %s reported an error: %s", self.machine_name, message)
            return
        info = self.open_attempts.pop(job, None)
        if info is None:
            return  # an error for a job that already ended changes nothing
        if not await self._tokens_relayed(info):
            return
        await local.channel_send(
            self.channel_layer,
            info["reply"],
            {"type": "host.error", "attempt": job, "message": message},
        )

    # --- messages from the job coroutines (channel layer) -----------------------------
    async def attempt_offer(self, message: dict) -> None:
        """Send an ``offer`` to the host and open the attempt on this connection.

        An offer of a claimed slot waits while a guessed offer here is not yet
        confirmed or withdrawn (``_offer_after_guesses``): the host's slot a
        guess holds is not counted by the database, so the claim may have
        given it away (another renter's request, a spot check) and the host
        would refuse the offer, and be blamed for it.
        """
        attempt_id = message["attempt"]
        # the guesses still open here: unsettled, or withdrawn with their
        # cancel not handled yet (it must reach the host before this offer)
        guesses = [
            info["confirmed"]
            for info in self.open_attempts.values()
            if info["confirmed"] is not None
            and not (info["confirmed"].done() and info["confirmed"].result())
        ]
        self.open_attempts[attempt_id] = {
            "reply": message["reply"],
            "claimed": False,
            # a guessed offer's (in-process only: EarlyOffer.guess_send)
            "confirmed": message.get("confirmed"),
        }
        if guesses:
            task = asyncio.create_task(
                self._offer_after_guesses(attempt_id, message["frame"], guesses)
            )
            self.background_tasks.add(task)
            task.add_done_callback(self.background_tasks.discard)
            return
        await self.send_json(message["frame"])

    async def _offer_after_guesses(
        self, attempt_id: str, frame: dict, guesses: list[asyncio.Future]
    ) -> None:
        """Send ``frame`` once ``guesses`` are settled, the withdrawn ones
        cancelled on the host first (their slots free there); not at all when
        the attempt was cancelled meanwhile."""
        await asyncio.wait(guesses)  # settled ones return at once
        for guessed_id, info in list(self.open_attempts.items()):
            confirmed = info["confirmed"]
            if confirmed is not None and confirmed.done() and not confirmed.result():
                await self._attempt_drop(guessed_id)
        if attempt_id in self.open_attempts:
            await self.send_json(frame)

    async def machine_replaced(self, message: dict) -> None:
        """Another connection of this machine said hello: close this one."""
        await self.send_error(
            "another connection of this machine took over; closing this one"
        )
        await self.close(code=4409)

    async def attempt_cancel(self, message: dict) -> None:
        """Tell the host to stop an attempt; later frames of it are ignored.

        Sent for every failed or cancelled attempt, even one the host itself
        reported as failed, so a host never keeps generating for nobody.
        """
        await self._attempt_drop(message["attempt"])

    async def _attempt_drop(self, attempt_id: str) -> None:
        """Close an attempt on this connection and tell the host to stop it."""
        if self.open_attempts.pop(attempt_id, None) is not None:
            self.cancelled.append(attempt_id)
        await self.send_json({"type": "cancel", "job": attempt_id})

    # --- helpers ---------------------------------------------------------------------
    async def _stray_frame(self, attempt_id: str, error: str) -> None:
        """A frame for an attempt not open (or not claimed) on this connection:
        an ``error`` frame, unless this connection cancelled it lately."""
        if attempt_id not in self.cancelled:
            await self.send_error(error)

    async def send_json(self, content: dict) -> None:
        await self.send(text_data=json.dumps(content))

    async def send_error(self, message: str) -> None:
        await self.send_json({"type": "error", "message": message})
