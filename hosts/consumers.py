"""The host websocket, ``ballast.host.v1`` (PROTOCOL.md §2): the machine's side.

One consumer per machine connection. Every frame is checked before it can change
anything: a malformed or unknown frame gets an ``error`` frame back and is
otherwise ignored, so one broken host never hurts another. This class handles
what concerns the machine (hello, heartbeats, capability and benchmark reports);
the frames of attempts (claim, token, done, error) and the offers are the job
relay's (``jobs.consumers.host.HostRelayConsumer``, which extends it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone
from redis import RedisError

from ballast import local
from ballast.consumers import (
    CLOSE_NO_GREETING,
    CLOSE_TOO_MANY,
    CLOSE_TRY_LATER,
    DirectDispatchConsumer,
)
from ballast.db import db_call, db_call_retried, lock_conflict
from ballast.sockets import SocketCap
from billing.receipts import challenge_verify
from catalog.selectors import catalog_model_ids, catalog_vram_needs_mb

from . import liveness as liveness_lease
from . import protocol, services
from .models import token_hash

log = logging.getLogger("ballast.hosts")

CLOSE_UNAUTHORIZED = 4401
CLOSE_KEY_MISMATCH = 4403
CLOSE_PROTOCOL = 4400
CLOSE_NO_PROOF = 4426  # a hello without the challenge's proof (an agent to upgrade)
MAX_FRAME_BYTES = 256 * 1024


def _utf8_size(text: str) -> int:
    """The size of ``text`` on the wire, bytes (UTF-8): the frame bound counts
    bytes, not characters (a character is up to 4)."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def bearer_token(scope: dict) -> str:
    """The bearer token of the ``Authorization`` header of an ASGI scope, or ''."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            text = value.decode("latin-1").strip()
            if text[:7].lower() == "bearer ":
                return text[7:].strip()
    return ""


class HostConsumer(DirectDispatchConsumer):
    """A machine's connection: hello, heartbeats and reports.

    Hooks for the consumers that extend it (the job relay,
    ``jobs.consumers.HostRelayConsumer``, and the checks run beside it,
    ``trust.consumers.MachineConsumer``): ``heartbeat_stored(result)`` after
    a heartbeat's write, ``spot_checks_poke()`` (called by the process lease's
    loop, ``hosts.liveness``), ``unreadable_frame_received()`` after a frame that could
    not be read (no job can be named from it), ``connection_closed()`` when the
    socket ends.
    """

    disconnecting = False
    host_paused = False

    async def connect(self) -> None:
        """Authenticate the token (its owner active), count the socket against
        its machine's and its address's caps (full: an ``error`` frame and
        close 4429), accept, send the ``challenge`` the ``hello`` must sign
        (docs/protocol-notes.md) and close it (4408) if no ``hello`` came
        within ``BALLAST_HELLO_TIMEOUT_S``. While the database or Redis cannot
        be reached (restarting), the socket is accepted, told so in an
        ``error`` frame and closed 1013 (try again later), not failed with an
        HTTP 500."""
        token = bearer_token(self.scope)
        subprotocols = self.scope.get("subprotocols") or []
        subprotocol = (
            protocol.PROTOCOL_NAME if protocol.PROTOCOL_NAME in subprotocols else None
        )
        try:
            machine = await db_call(services.machine_authenticate)(token=token)
            full = (
                None
                if machine is None
                else await self.sockets_take(
                    SocketCap("machine", str(machine.id), "BALLAST_SOCKETS_PER_MACHINE")
                )
            )
        except (DatabaseError, RedisError, OSError) as exc:
            log.warning("host websocket connect: %s: %s", type(exc).__name__, exc)
            await self.accept(subprotocol=subprotocol)
            await self.send_error(
                "the coordinator cannot admit connections right now (its database "
                "or Redis is restarting); reconnect in a few seconds"
            )
            await self.refuse(CLOSE_TRY_LATER)
            return
        if machine is None:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        await self.accept(subprotocol=subprotocol)
        if full is not None:
            await self.send_error(
                f"too many open connections: at most {full.cap} per {full.kind} "
                f"({full.setting}); close one first"
            )
            await self.refuse(CLOSE_TOO_MANY)
            return
        self.machine_id = str(machine.id)
        self.machine_name = machine.name
        self.token_hash = token_hash(token)
        self.greeted = False
        self.background_tasks: set[asyncio.Task] = set()
        self.nonce = secrets.token_urlsafe(24)
        await self.send_json({"type": "challenge", "nonce": self.nonce})
        self.greeting_deadline_start()

    async def greeting_deadline(self, message: dict) -> None:
        """``BALLAST_HELLO_TIMEOUT_S`` after the accept: a connection that has
        not said a good ``hello`` gets an ``error`` frame and is closed (4408)."""
        if not self.greeted and not self.refused:
            await self.send_error(
                f"no hello within {settings.BALLAST_HELLO_TIMEOUT_S:g} s; closing"
            )
            await self.refuse(CLOSE_NO_GREETING)

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
        await self.connection_closed()

    async def connection_closed(self) -> None:
        """The machine's connection ended (after its row says so)."""

    async def heartbeat_stored(self, result: services.HeartbeatResult) -> None:
        """A heartbeat's changes were written (``services.machine_heartbeat``)."""

    def spot_checks_poke(self) -> None:
        """Take this machine's due spot checks soon (the checks')."""

    async def unreadable_frame_received(self) -> None:
        """A frame past the bound or not JSON arrived (the checks')."""

    # --- frames from the host ---------------------------------------------------------
    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None
    ) -> None:
        if text_data is None or _utf8_size(text_data) > MAX_FRAME_BYTES:
            await self.send_error("frames must be JSON text of at most 256 KiB")
            await self.unreadable_frame_received()
            return
        try:
            frame = json.loads(text_data)
        except (ValueError, RecursionError):
            await self.send_error("frame is not valid JSON")
            await self.unreadable_frame_received()
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
        """Check the ``hello``: its ``proof`` signs this connection's challenge
        with the key it announces (none: 4426; a wrong one: 4403), the key is
        the pinned one (4403), the token still the machine's and its owner
        active (4401); then record it and send ``welcome``. A connection of
        the machine it replaces is closed (4409)."""
        hello = protocol.parse_hello(frame)
        proof = protocol.parse_hello_proof(frame)
        if not proof:
            await self.send_error(
                "hello: no proof of the challenge; this coordinator needs an agent "
                "that signs it (docs/protocol-notes.md, 2026-12-01)"
            )
            await self.close(code=CLOSE_NO_PROOF)
            return
        if not challenge_verify(
            public_key_b64=hello["public_key"], proof_b64=proof, nonce=self.nonce
        ):
            await self.send_error("hello: the proof does not sign this challenge")
            await self.close(code=CLOSE_KEY_MISMATCH)
            return
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
                token_hash=self.token_hash,
            )
        except services.KeyMismatch as exc:
            await self.send_error(str(exc))
            await self.close(code=CLOSE_KEY_MISMATCH)
            return
        except services.MachineRefused as exc:
            await self.send_error(str(exc))
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        if previous and previous != self.channel_name:
            # one connection per machine: the newer one wins, the older is closed
            await local.channel_send(
                self.channel_layer, previous, {"type": "machine.replaced"}
            )
        self.greeted = True
        # the devices this connection may speak of (the others are retired)
        self.device_indexes = frozenset(d["index"] for d in hello["devices"])
        self.heartbeat_memo = services.HeartbeatMemo()
        self.liveness_lock = asyncio.Lock()
        self.heartbeat_tasks: set[asyncio.Task] = set()
        self.lease = lease
        lease.join(self.machine_id, self)
        self.vram_needs_mb = await db_call(catalog_vram_needs_mb)()
        self.catalog_ids = await db_call(catalog_model_ids)()
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
        heartbeat = protocol.parse_heartbeat(frame, known=self.device_indexes)
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
            await self.heartbeat_stored(result)
        except Exception:
            log.exception("heartbeat of machine %s not stored", self.machine_name)

    def _catalog_model(self, frame_type: str, model_id: str) -> None:
        """Refuse a report about a model that is not in the catalog (bounded rows)."""
        if model_id not in self.catalog_ids:
            raise protocol.FrameError(
                f"{frame_type}: model {model_id[:100]!r} is not in the catalog"
            )

    async def frame_model_load_failed(self, frame: dict) -> None:
        report = protocol.parse_model_load_failed(frame)
        protocol.device_known(
            "model_load_failed", report["device"], self.device_indexes
        )
        self._catalog_model("model_load_failed", report["model"])
        await db_call(services.capability_failed_record)(
            machine_id=self.machine_id, report=report
        )

    async def frame_benchmark(self, frame: dict) -> None:
        report = protocol.parse_benchmark(frame)
        protocol.device_known("benchmark", report["device"], self.device_indexes)
        self._catalog_model("benchmark", report["model"])
        saved = await db_call(services.benchmark_record)(
            machine_id=self.machine_id, report=report
        )
        if saved is None:
            await self.send_error(f"benchmark: unknown device {report['device']}")

    async def machine_replaced(self, message: dict) -> None:
        """Another connection of this machine said hello: close this one."""
        await self.send_error(
            "another connection of this machine took over; closing this one"
        )
        await self.close(code=4409)

    async def machine_revoked(self, message: dict) -> None:
        """The machine's token was rotated or revoked, or its owner deactivated
        (``services.machine_connections_close``): close at once (4401)."""
        await self.send_error(
            "this machine's token was rotated or revoked, or its owner deactivated"
        )
        await self.close(code=CLOSE_UNAUTHORIZED)

    # --- helpers ---------------------------------------------------------------------
    async def send_json(self, content: dict) -> None:
        await self.send(text_data=json.dumps(content))

    async def send_error(self, message: str) -> None:
        await self.send_json({"type": "error", "message": message})
