"""A machine's socket with the checks it runs beside its jobs: the spot checks
due on its devices (DESIGN.md "Spot checks") and the verifications of other
hosts' answers offered to it (DESIGN.md "Verifying real answers";
``trust.verification``).

``MachineConsumer`` (the socket ``ballast.asgi`` routes) is
``jobs.consumers.HostRelayConsumer`` with ``ChecksRelay`` mixed in, which needs
the consumer's ``machine_id``, ``machine_name``, ``send_json`` and
``send_error``.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing

from django.conf import settings

from ballast.db import db_call
from hosts import protocol
from hosts.services import HeartbeatResult
from jobs.consumers import HostRelayConsumer
from jobs.orchestration import JobRun

from . import spotchecks
from .verification.checks import verifier_checks_take_due
from .verification.offers import verification_send
from .verification.plausibility import token_scores_parse
from .verification.records import (
    VERIFY_MAX_TOKENS,
    VerificationNotOpen,
    verification_refused,
    verification_scored,
)

log = logging.getLogger("ballast.jobs")


class ChecksRelay:
    """Spot checks run and verifications relayed on one machine's connection."""

    def checks_open(self) -> None:
        """Start with no check running and no verification offered (``connect``)."""
        self.spot_check_tasks: set[asyncio.Task] = set()
        # ids (hex) of the verifications offered here and not answered yet
        self.verifications: set[str] = set()

    # --- spot checks -------------------------------------------------------------
    def spot_checks_poke(self) -> None:
        """Take this machine's due spot checks soon (called by the lease loop)."""
        task = asyncio.create_task(self._spot_checks_start())
        self.spot_check_tasks.add(task)
        task.add_done_callback(self.spot_check_tasks.discard)

    async def _spot_checks_start(self) -> None:
        """Run the spot checks due on this machine's devices (a compare-and-set
        takes each), and send the checks due of them as verifiers."""
        if settings.BALLAST_VERIFIER_CHECKS:
            try:
                for ver_id, frame in await db_call(verifier_checks_take_due)(
                    machine_id=self.machine_id
                ):
                    await self.verify_offer({"verification": ver_id, "frame": frame})
            except Exception:
                log.exception("checks of verifiers on machine %s", self.machine_name)
        if not settings.BALLAST_SPOT_CHECKS:
            return
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

    # --- verifications -----------------------------------------------------------
    async def verify_offer(self, message: dict) -> None:
        """Send a ``verify`` to the host (``verification.offers``) and
        expect its ``scores`` on this connection."""
        self.verifications.add(message["verification"])
        await self.send_json(message["frame"])

    async def frame_scores(self, frame: dict) -> None:
        """A verifier's ``scores``: judged, stored and paid
        (``verification_scored``); a malformed one is refused against this
        verifier (and answered with an ``error`` frame). A round 2 it calls
        for is sent to its own verifier. Nothing here can fail a renter's job."""
        ver_id = protocol.parse_verification_frame(frame)
        # (the database decides what is open to this machine: a verify sent
        # before a reconnect is still answered)
        self.verifications.discard(ver_id)
        try:
            scores = protocol.parse_scores(frame)
            tokens = token_scores_parse(scores["tokens"], max_tokens=VERIFY_MAX_TOKENS)
        except (protocol.FrameError, ValueError) as exc:
            await self._verification_refused(ver_id, f"malformed scores: {exc}")
            raise protocol.FrameError(str(exc)) from None
        try:
            second = await db_call(verification_scored)(
                verification_id=ver_id,
                machine_id=self.machine_id,
                tokens=tokens,
                receipt=scores["receipt"],
            )
        except VerificationNotOpen as exc:
            await self.send_error(f"scores: {exc}")
            return
        except Exception:
            log.exception("verification %s: scores not recorded", ver_id)
            return
        if second is not None:
            await verification_send(second)

    async def verification_error(self, ver_id: str, message: str) -> bool:
        """An ``error`` frame naming job ``ver_id``: True when it was a
        verification offered here (then refused against this verifier)."""
        if ver_id not in self.verifications:
            return False
        self.verifications.discard(ver_id)
        await self._verification_refused(ver_id, f"error: {message}")
        return True

    async def unreadable_frame_received(self) -> None:
        """A frame this connection could not read (past 256 KiB, or not JSON)
        while verifications were offered here: each is refused against this
        verifier (an honest agent's ``scores`` always fit, and no other frame
        of an honest agent is unreadable), so none waits for its deadline."""
        for ver_id in sorted(self.verifications):
            self.verifications.discard(ver_id)
            await self._verification_refused(
                ver_id, "an unreadable frame (past 256 KiB or not JSON) while scoring"
            )

    async def _verification_refused(self, ver_id: str, detail: str) -> None:
        """Refuse ``ver_id`` against this verifier; the round it calls for
        instead goes to its own verifier."""
        try:
            nxt = await db_call(verification_refused)(
                verification_id=ver_id, machine_id=self.machine_id, detail=detail
            )
        except Exception:
            log.exception("verification %s: refusal not recorded", ver_id)
            return
        if nxt is not None:
            await verification_send(nxt)


class MachineConsumer(ChecksRelay, HostRelayConsumer):
    """A machine's connection: its jobs' frames relayed
    (``jobs.consumers.HostRelayConsumer``), its checks run beside them."""

    async def connect(self) -> None:
        self.checks_open()
        await super().connect()

    async def heartbeat_stored(self, result: HeartbeatResult) -> None:
        """Capacity came (the queued requests woken); due spot checks start."""
        await super().heartbeat_stored(result)
        await self._spot_checks_start()

    async def error_unopened(self, job: str, message: str) -> None:
        """An ``error`` frame for no open attempt: a verification's, if one
        was offered here (``verification_error``)."""
        await self.verification_error(job, message)
