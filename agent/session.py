"""One connection's session: hello/welcome, heartbeats, offers and running jobs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from agent import __version__
from agent.engines.base import FEATURES, GenerationRequest, GenerationResult
from agent.frames import (
    MAX_MESSAGE_CHARS,
    frame_parse,
    frame_summary,
    request_from_offer,
)
from agent.outbox import Outbox, corked, first_piece, sendable
from agent.receipts import challenge_sign, public_key_b64, receipt_sign
from agent.verify import verify_handle

if TYPE_CHECKING:
    from agent.client import HostAgent

log = logging.getLogger(__name__)



class Session:
    """State of one connection: the send lock, the running jobs, the heartbeat."""

    def __init__(self, agent: HostAgent, ws: ClientConnection) -> None:
        self.agent = agent
        self.ws = ws
        self.jobs: dict[str, asyncio.Task[None]] = {}
        # per running job: the text of its token frames written, and its
        # engine's pieces (about one token each), for the receipt of a cancel
        self.sent: dict[str, list[str]] = {}
        self.pieces: dict[str, int] = {}
        # ``cancelled`` and ``scores`` (verify) answers on their way
        self.answers: set[asyncio.Task[None]] = set()
        self._send_lock = asyncio.Lock()
        self._heartbeat: asyncio.Task[None] | None = None

    async def send(self, *frames: dict[str, Any]) -> None:
        """Send JSON frames, in order; safe to call from concurrent tasks.

        Several frames leave in one TCP segment where the platform can hold the
        socket's output (Linux ``TCP_CORK``) while they are written. Raises
        ``ConnectionClosed`` when the connection is gone.
        """
        data = [json.dumps(frame, ensure_ascii=False) for frame in frames]
        async with self._send_lock:
            with corked(self.ws, len(data) > 1):
                for frame, text in zip(frames, data, strict=True):
                    if frame["type"] == "token" and frame["job"] in self.sent:
                        # a text frame is written before ``send`` first waits:
                        # from here on it has left (what a cancel's receipt signs)
                        self.sent[frame["job"]].append(frame["text"])
                    await self.ws.send(text)
        if log.isEnabledFor(logging.DEBUG):  # the summary is a JSON encoding
            for frame in frames:
                log.debug("sent %s", frame_summary(frame))

    async def challenge(self) -> str | None:
        """The coordinator's ``challenge`` nonce, its first frame; None when none
        comes within ``welcome_timeout_s`` (a coordinator of before 2026-12-01).
        Raises ``ConnectionClosed`` when the connection closes first."""
        try:
            async with asyncio.timeout(self.agent.config.welcome_timeout_s):
                while True:
                    frame = frame_parse(await self.ws.recv())
                    if frame is None:
                        continue
                    if frame["type"] == "challenge" and isinstance(
                        frame.get("nonce"), str
                    ):
                        return frame["nonce"]
                    log.warning("ignoring %r before the challenge", frame["type"])
        except TimeoutError:
            log.warning("no challenge from the coordinator; hello without proof")
            return None

    async def open(self) -> bool:
        """Answer the ``challenge``, send ``hello`` (with ``proof``: the nonce
        signed with the receipt key) and wait for ``welcome``; False on timeout
        or close."""
        agent = self.agent
        nonce = await self.challenge()
        hello = {
            "type": "hello",
            "agent_version": __version__,
            "engine": {"name": agent.engine.name, "version": agent.engine.version},
            "public_key": public_key_b64(agent.key),
            "accepts_serverless": agent.config.accepts_serverless,
            "features": sorted(set(agent.engine.features) & set(FEATURES)),
            **({"verifies": True} if agent.engine.verifies else {}),
            "devices": [
                {
                    "index": d.index,
                    "name": d.name,
                    "kind": d.kind,
                    "vram_total_mb": d.vram_total_mb,
                }
                for d in agent.telemetry.devices()
            ],
        }
        if nonce is not None:
            hello["proof"] = challenge_sign(agent.key, nonce)
        await self.send(hello)
        try:
            async with asyncio.timeout(agent.config.welcome_timeout_s):
                while True:
                    frame = frame_parse(await self.ws.recv())
                    if frame is None:
                        continue
                    if frame["type"] == "welcome":
                        break
                    if frame["type"] == "error":
                        log.error("coordinator error: %s", frame.get("message"))
                    else:
                        log.warning("ignoring %r before welcome", frame["type"])
        except TimeoutError:
            log.error(
                "no welcome within %.0f s; closing", agent.config.welcome_timeout_s
            )
            await self.ws.close()
            return False
        agent.machine_id = str(frame.get("machine_id"))
        interval = frame.get("heartbeat_interval_s")
        if not isinstance(interval, (int, float)) or interval <= 0:
            log.warning("welcome without a valid heartbeat_interval_s; using 10 s")
            interval = 10.0
        await self.send(self.heartbeat_frame())
        self._heartbeat = asyncio.create_task(self._heartbeat_loop(max(0.05, interval)))
        return True

    async def reports_send(self) -> None:
        """Send ``model_load_failed`` for each failed model, and the benchmark."""
        agent = self.agent
        for error in agent.load_errors:
            await self.send(
                {
                    "type": "model_load_failed",
                    "device": agent.config.device,
                    "model": error.model,
                    "error": error.error[:MAX_MESSAGE_CHARS] or "unknown error",
                }
            )
        if agent.benchmark:
            await self.send({"type": "benchmark", **agent.benchmark})
            agent.benchmark = None  # once per process: it is a measurement, not state

    async def serve(self) -> None:
        """Handle frames until the connection closes."""
        await self.reports_send()
        async for message in self.ws:
            frame = frame_parse(message)
            if frame is None:
                continue
            try:
                await self.frame_handle(frame)
            except ConnectionClosed:
                raise
            except Exception:  # a bad frame must never end the session
                log.exception("failed to handle a %r frame", frame.get("type"))

    async def shutdown(self) -> None:
        """Stop the heartbeat and every running job of this session."""
        tasks = list(self.jobs.values()) + list(self.answers)
        if self._heartbeat is not None:
            tasks.append(self._heartbeat)
        self.jobs.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def frame_handle(self, frame: dict[str, Any]) -> None:
        """Dispatch one coordinator frame by its type."""
        kind = frame["type"]
        if kind == "offer":
            await self.offer(frame)
        elif kind == "cancel":
            self.cancel(frame)
        elif kind == "verify":
            await verify_handle(self, frame)
        elif kind == "error":
            job = frame.get("job")
            log.warning(
                "coordinator error%s: %s",
                f" (job {job})" if job else "",
                frame.get("message"),
            )
        elif kind == "welcome":
            log.debug("ignoring a second welcome")
        else:
            log.warning("ignoring unknown frame type %r", kind)

    async def offer(self, frame: dict[str, Any]) -> None:
        """Claim the offered job and start streaming it, or refuse it with an
        ``error`` frame (no free slot, model not loaded, malformed offer)."""
        agent = self.agent
        job = frame.get("job")
        if not isinstance(job, str) or not job:
            log.warning("ignoring an offer without a job id")
            return
        if job in self.jobs:
            log.warning("ignoring a second offer for running job %s", job)
            return
        if not agent.engine.claims_offers:
            log.info("job %s: not claiming (scripted never_claim)", job)
            return
        try:
            request = request_from_offer(frame, agent.config.device)
            loaded = agent.engine.loaded_models()
            if request.model not in loaded:
                raise ValueError(
                    f"model {request.model} is not loaded here (loaded: {loaded})"
                )
            if len(self.jobs) >= agent.config.slots:
                raise ValueError(
                    f"no free slot ({agent.config.slots} of {agent.config.slots} busy)"
                )
            missing = request.features_needed() - set(agent.engine.features)
            if missing:  # never served as plain text: refused, naming it
                raise ValueError(
                    f"this engine cannot serve {', '.join(sorted(missing))}"
                )
        except ValueError as exc:
            log.warning("job %s refused: %s", job, exc)
            await self.send({"type": "error", "job": job, "message": str(exc)})
            return
        self.jobs[job] = asyncio.create_task(
            self._job_run(job, request), name=f"job-{job}"
        )

    def cancel(self, frame: dict[str, Any]) -> None:
        """Stop a job at once: its slot frees, no ``token`` of it is sent
        afterwards, and a ``cancelled`` answers with the usage and a receipt
        over the text sent (so the host is paid for what the renter got)."""
        job = frame.get("job")
        task = self.jobs.pop(job, None) if isinstance(job, str) else None
        if task is None:
            log.debug("cancel for a job that is not running: %r", job)
            return
        task.cancel()
        answer = asyncio.create_task(self._cancelled_send(job, task))
        self.answers.add(answer)
        answer.add_done_callback(self.answers.discard)
        log.info("job %s cancelled by the coordinator", job)

    async def _cancelled_send(self, job: str, task: asyncio.Task[None]) -> None:
        """Once the cancelled job's task has ended (nothing more leaves for
        it), send ``cancelled``: ``usage.completion_tokens`` counts the
        engine's pieces sent (about one token each; never above the
        characters), ``receipt`` signs them over the exact text sent."""
        await asyncio.gather(task, return_exceptions=True)
        text = "".join(self.sent.pop(job, ()))
        tokens = min(self.pieces.pop(job, 0), len(text))
        signed = text if self.agent.engine.signs_honestly else text + "\u2063"
        with contextlib.suppress(ConnectionClosed):
            await self.send(
                {
                    "type": "cancelled",
                    "job": job,
                    "usage": {"prompt_tokens": 0, "completion_tokens": tokens},
                    "receipt": receipt_sign(self.agent.key, job, tokens, signed),
                }
            )

    async def _job_run(self, job: str, request: GenerationRequest) -> None:
        """Claim, stream the engine's pieces as ``token`` frames, then ``done``
        with a receipt over the exact text sent (or ``error``)."""
        engine = self.agent.engine
        sent: list[str] = []
        result = GenerationResult()
        claim = {"type": "claim", "job": job}
        outbox = Outbox(self, job, logprobs=request.logprobs is not None)
        self.sent[job] = []
        self.pieces[job] = 0
        try:
            async with _closing(engine.stream(request, result)) as pieces:
                first = await first_piece(pieces, self, claim, outbox)
                log.info(
                    "job %s claimed (%s)",
                    job,
                    "continuation" if request.continue_from else "fresh",
                )
                if first:
                    sent.append(first)
                    self.pieces[job] += 1
                async for piece in pieces:
                    piece = sendable(piece)
                    if not piece:
                        continue
                    sent.append(piece)
                    self.pieces[job] += 1
                    outbox.add(piece)
                    if outbox.full():
                        await outbox.flush()
            await outbox.flush()
            text = "".join(sent)
            signed = text if engine.signs_honestly else text + "\u2063"
            finish = (
                result.finish_reason
                if result.finish_reason in ("stop", "length")
                else "stop"
            )
            done = {
                "type": "done",
                "job": job,
                "finish_reason": finish,
                "usage": {
                    "prompt_tokens": int(result.prompt_tokens),
                    "completion_tokens": int(result.completion_tokens),
                },
                "receipt": receipt_sign(
                    self.agent.key, job, result.completion_tokens, signed
                ),
            }
            if result.token_ids is not None:  # the tokens drawn (2026-12-06)
                done["token_ids"] = [int(token) for token in result.token_ids]
            await self.send(done)
            log.info(
                "job %s done: %d tokens, %d chars, %s",
                job,
                result.completion_tokens,
                len(text),
                finish,
            )
        except asyncio.CancelledError:
            raise
        except ConnectionClosed:
            log.info("job %s stopped: the connection closed", job)
        except Exception as exc:
            message = (str(exc) or type(exc).__name__)[:MAX_MESSAGE_CHARS]
            log.warning("job %s failed: %s", job, message)
            with contextlib.suppress(ConnectionClosed):
                await outbox.flush()  # the text sent before the error, then the error
                await self.send({"type": "error", "job": job, "message": message})
        finally:
            outbox.cancel()
            if self.jobs.get(job) is asyncio.current_task():
                del self.jobs[job]  # not cancelled: its receipt is the done's
                self.sent.pop(job, None)
                self.pieces.pop(job, None)

    async def _heartbeat_loop(self, interval_s: float) -> None:
        """A heartbeat every ``interval_s`` (the first one is sent by ``open``)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.send(self.heartbeat_frame())
            except ConnectionClosed:
                return
            except Exception:  # a telemetry failure must not end the session
                log.exception("heartbeat failed")

    def heartbeat_frame(self) -> dict[str, Any]:
        """The ``heartbeat`` frame now: each device's telemetry, this engine's
        device with its loaded models, their weights (``Engine.weights_loaded``)
        and slots; ``paused`` while the agent drains before stopping
        (``HostAgent.drain``)."""
        agent = self.agent
        loaded = agent.engine.loaded_models()
        weights = {
            model: {"sha256": w.sha256, "quantization": w.quantization}
            for model, w in agent.engine.weights_loaded.items()
            if model in loaded
        }
        devices = []
        for status in agent.telemetry.statuses():
            mine = status.index == agent.config.device
            devices.append(
                {
                    "index": status.index,
                    "temp_c": status.temp_c,
                    "vram_free_mb": status.vram_free_mb,
                    "loaded_models": list(loaded) if mine else [],
                    "weights": weights if mine else {},
                    "slots": agent.config.slots if mine else 0,
                }
            )
        return {"type": "heartbeat", "devices": devices, "paused": agent.draining}


@contextlib.asynccontextmanager
async def _closing(stream: AsyncIterator[str]) -> AsyncIterator[AsyncIterator[str]]:
    """Close an engine stream however the iteration ends (stops the engine)."""
    try:
        yield stream
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
