"""The protocol client: a machine's websocket to the coordinator (ballast.host.v1).

Flow (PROTOCOL.md section 2): connect with the machine token → ``hello`` →
``welcome`` → a heartbeat at once and then every ``heartbeat_interval_s`` →
``offer`` → ``claim`` → ``token``… → ``done`` (with a receipt) or ``error``.
The connection is re-opened with backoff whenever it drops; jobs running on a
dropped connection are stopped (the coordinator has already given up on them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Subprotocol

from agent import __version__
from agent.engines.base import (
    Engine,
    GenerationRequest,
    GenerationResult,
    ModelLoadError,
)
from agent.receipts import public_key_b64, receipt_sign
from agent.telemetry import Telemetry

log = logging.getLogger(__name__)

SUBPROTOCOL = Subprotocol("ballast.host.v1")
WS_PATH = "/ws/host/"
CLOSE_UNAUTHORIZED = 4401
"""Close code of a coordinator that refuses the machine token after accepting."""


def ws_url_from_server(server_url: str) -> str:
    """The host websocket address of a coordinator base URL.

    ``http://127.0.0.1:8000`` → ``ws://127.0.0.1:8000/ws/host/`` (https → wss).
    A ``ws://``/``wss://`` URL ending in ``/ws/host/`` is returned unchanged.
    Raises ``ValueError`` for another scheme or a URL without a host.
    """
    parts = urlsplit(server_url.strip())
    schemes = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
    if parts.scheme not in schemes or not parts.netloc:
        raise ValueError(
            f"not a coordinator URL (http[s]://host[:port]): {server_url!r}"
        )
    path = parts.path.rstrip("/")
    if not path.endswith(WS_PATH.rstrip("/")):
        path += WS_PATH.rstrip("/")
    return urlunsplit((schemes[parts.scheme], parts.netloc, path + "/", "", ""))


@dataclass
class AgentConfig:
    """Settings of one agent process.

    ``slots``: concurrent jobs on the engine's device. ``device``: index of the
    device the engine runs on (offers for another device are refused).
    ``welcome_timeout_s``: how long to wait for ``welcome`` after ``hello`` (s).
    ``retry_min_s``/``retry_max_s``: backoff (s) after a session that ended
    before ``welcome`` (a refused token, a key mismatch).
    """

    server_url: str
    token: str
    slots: int = 1
    accepts_serverless: bool = True
    device: int = 0
    welcome_timeout_s: float = 30.0
    retry_min_s: float = 2.0
    retry_max_s: float = 60.0

    @property
    def ws_url(self) -> str:
        """The websocket address derived from ``server_url``."""
        return ws_url_from_server(self.server_url)


class HostAgent:
    """Connects a machine to the coordinator and serves offers with ``engine``.

    ``key`` signs receipts (its public half is announced in ``hello``);
    ``benchmark`` (the fields of a ``benchmark`` frame) is sent after the first
    ``welcome`` when given; failed model loads after every ``welcome``.
    Call ``load`` once, then ``run`` (forever) or ``report_once`` (one session:
    hello, welcome, reports, close).
    """

    def __init__(
        self,
        *,
        config: AgentConfig,
        engine: Engine,
        key: Ed25519PrivateKey,
        telemetry: Telemetry | None = None,
        benchmark: dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.key = key
        self.telemetry = telemetry or Telemetry()
        self.benchmark = benchmark
        self.load_errors: list[ModelLoadError] = []
        self.machine_id: str | None = None
        self.connected = asyncio.Event()

    async def load(self) -> None:
        """Load the engine's model(s); a failure is kept and reported to the
        coordinator as ``model_load_failed`` after every ``welcome``."""
        try:
            await self.engine.load()
        except ModelLoadError as exc:
            log.error("%s", exc)
            self.load_errors.append(exc)

    async def run(self) -> None:
        """Stay connected until cancelled, reconnecting with backoff.

        A handshake refused by the coordinator (HTTP 401/403: bad token) and a
        session closed before ``welcome`` (close code 4401) are retried with a
        growing delay, never in a tight loop.
        """
        url = self.config.ws_url
        refusals = _delays(self.config.retry_min_s, self.config.retry_max_s)
        async for ws in self._connect(url):
            welcomed = False
            try:
                welcomed = await self._serve(ws, url)
            except ConnectionClosed:  # closed before welcome
                pass
            except Exception:  # a bug must not take the machine offline for good
                log.exception("the session failed")
                await ws.close(1011, "agent error")
            self._log_close(ws, welcomed)
            if welcomed:
                refusals = _delays(self.config.retry_min_s, self.config.retry_max_s)
                log.info("disconnected from %s; reconnecting", url)
                continue
            delay = next(refusals)
            log.warning("reconnecting to %s in %.1f s", url, delay)
            await asyncio.sleep(delay)

    async def report_once(self) -> bool:
        """Connect once: hello, welcome, heartbeat and reports (benchmark,
        load failures), then close. Returns True when ``welcome`` came.

        Raises ``OSError``/``InvalidHandshake`` when the connection fails.
        """
        url = self.config.ws_url
        async with self._connect(url) as ws:
            session = _Session(self, ws)
            try:
                welcomed = await session.open()
            except ConnectionClosed:
                self._log_close(ws, welcomed=False)
                return False
            try:
                if welcomed:
                    log.info("connected to %s as machine %s", url, self.machine_id)
                    await session.reports_send()
            finally:
                await session.shutdown()
            await ws.close()
            return welcomed

    def _connect(self, url: str) -> connect:
        return connect(
            url,
            additional_headers={"Authorization": f"Bearer {self.config.token}"},
            subprotocols=[SUBPROTOCOL],
            process_exception=_connect_exception,
            max_size=16 * 2**20,
            user_agent_header=f"ballast-agent/{__version__}",
        )

    async def _serve(self, ws: ClientConnection, url: str) -> bool:
        """One session on an open connection; returns True if ``welcome`` came."""
        session = _Session(self, ws)
        try:
            if not await session.open():
                return False
            log.info("connected to %s as machine %s", url, self.machine_id)
            self.connected.set()
            with contextlib.suppress(ConnectionClosed):
                await session.serve()
            return True
        finally:
            self.connected.clear()
            await session.shutdown()

    def _log_close(self, ws: ClientConnection, welcomed: bool) -> None:
        code, reason = ws.close_code, ws.close_reason or ""
        if code == CLOSE_UNAUTHORIZED:
            log.error(
                "the coordinator refused this machine (close code 4401 %s): "
                "check the machine token (--token or BALLAST_MACHINE_TOKEN)",
                reason,
            )
        elif code is not None and 4000 <= code < 5000:
            log.error("the coordinator closed the connection: code %s %s", code, reason)
        elif not welcomed:
            log.warning(
                "the connection closed before welcome (code %s %s)", code, reason
            )


class _Session:
    """State of one connection: the send lock, the running jobs, the heartbeat."""

    def __init__(self, agent: HostAgent, ws: ClientConnection) -> None:
        self.agent = agent
        self.ws = ws
        self.jobs: dict[str, asyncio.Task[None]] = {}
        self._send_lock = asyncio.Lock()
        self._heartbeat: asyncio.Task[None] | None = None

    async def send(self, frame: dict[str, Any]) -> None:
        """Send one JSON frame; safe to call from concurrent tasks.

        Raises ``ConnectionClosed`` when the connection is gone.
        """
        data = json.dumps(frame, ensure_ascii=False)
        async with self._send_lock:
            await self.ws.send(data)
        log.debug("sent %s", _frame_summary(frame))

    async def open(self) -> bool:
        """Send ``hello`` and wait for ``welcome``; False on timeout or close."""
        agent = self.agent
        await self.send(
            {
                "type": "hello",
                "agent_version": __version__,
                "engine": {"name": agent.engine.name, "version": agent.engine.version},
                "public_key": public_key_b64(agent.key),
                "accepts_serverless": agent.config.accepts_serverless,
                "devices": [
                    {"index": d.index, "name": d.name, "vram_total_mb": d.vram_total_mb}
                    for d in agent.telemetry.devices()
                ],
            }
        )
        try:
            async with asyncio.timeout(agent.config.welcome_timeout_s):
                while True:
                    frame = _frame_parse(await self.ws.recv())
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
        await self.send(self._heartbeat_frame())
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
                    "error": error.error,
                }
            )
        if agent.benchmark:
            await self.send({"type": "benchmark", **agent.benchmark})
            agent.benchmark = None  # once per process: it is a measurement, not state

    async def serve(self) -> None:
        """Handle frames until the connection closes."""
        await self.reports_send()
        async for message in self.ws:
            frame = _frame_parse(message)
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
        tasks = list(self.jobs.values())
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
            request = _request_from_offer(frame, agent.config.device)
            loaded = agent.engine.loaded_models()
            if request.model not in loaded:
                raise ValueError(
                    f"model {request.model} is not loaded here (loaded: {loaded})"
                )
            if len(self.jobs) >= agent.config.slots:
                raise ValueError(
                    f"no free slot ({agent.config.slots} of {agent.config.slots} busy)"
                )
        except ValueError as exc:
            log.warning("job %s refused: %s", job, exc)
            await self.send({"type": "error", "job": job, "message": str(exc)})
            return
        self.jobs[job] = asyncio.create_task(
            self._job_run(job, request), name=f"job-{job}"
        )

    def cancel(self, frame: dict[str, Any]) -> None:
        """Stop a job at once: no frame is sent for it afterwards; its slot frees."""
        job = frame.get("job")
        task = self.jobs.pop(job, None) if isinstance(job, str) else None
        if task is None:
            log.debug("cancel for a job that is not running: %r", job)
            return
        task.cancel()
        log.info("job %s cancelled by the coordinator", job)

    async def _job_run(self, job: str, request: GenerationRequest) -> None:
        """Claim, stream the engine's pieces as ``token`` frames, then ``done``
        with a receipt over the exact text sent (or ``error``)."""
        engine = self.agent.engine
        sent: list[str] = []
        result = GenerationResult()
        try:
            await self.send({"type": "claim", "job": job})
            log.info(
                "job %s claimed (%s)",
                job,
                "continuation" if request.continue_from else "fresh",
            )
            async with _closing(engine.stream(request, result)) as pieces:
                async for piece in pieces:
                    if not isinstance(piece, str) or not piece:
                        continue
                    sent.append(piece)
                    await self.send({"type": "token", "job": job, "text": piece})
            text = "".join(sent)
            signed = text if engine.signs_honestly else text + "\u2063"
            finish = (
                result.finish_reason
                if result.finish_reason in ("stop", "length")
                else "stop"
            )
            await self.send(
                {
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
            )
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
            message = str(exc) or type(exc).__name__
            log.warning("job %s failed: %s", job, message)
            with contextlib.suppress(ConnectionClosed):
                await self.send({"type": "error", "job": job, "message": message})
        finally:
            if self.jobs.get(job) is asyncio.current_task():
                del self.jobs[job]

    async def _heartbeat_loop(self, interval_s: float) -> None:
        """A heartbeat every ``interval_s`` (the first one is sent by ``open``)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.send(self._heartbeat_frame())
            except ConnectionClosed:
                return
            except Exception:  # a telemetry failure must not end the session
                log.exception("heartbeat failed")

    def _heartbeat_frame(self) -> dict[str, Any]:
        agent = self.agent
        loaded = agent.engine.loaded_models()
        devices = []
        for status in agent.telemetry.statuses():
            mine = status.index == agent.config.device
            devices.append(
                {
                    "index": status.index,
                    "temp_c": status.temp_c,
                    "vram_free_mb": status.vram_free_mb,
                    "loaded_models": list(loaded) if mine else [],
                    "slots": agent.config.slots if mine else 0,
                }
            )
        return {"type": "heartbeat", "devices": devices, "paused": False}


def _request_from_offer(frame: dict[str, Any], device: int) -> GenerationRequest:
    """Build a ``GenerationRequest`` from an offer.

    Raises ``ValueError`` naming the bad field.
    """
    if frame.get("device", device) != device:
        raise ValueError(
            f"device {frame.get('device')!r} is not served here (device {device})"
        )
    model = frame.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError("offer without a model")
    messages, prompt = frame.get("messages"), frame.get("prompt")
    if messages is not None:
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) for m in messages
        ):
            raise ValueError("messages must be a list of objects")
        prompt = None
    elif not isinstance(prompt, str):
        raise ValueError("offer has neither messages nor a prompt")
    params = frame.get("params") or {}
    if not isinstance(params, dict):
        raise ValueError("params must be an object")
    for key in ("max_tokens", "seed"):
        if params.get(key) is not None and (
            not isinstance(params[key], int) or isinstance(params[key], bool)
        ):
            raise ValueError(f"params.{key} must be an integer")
    for key in ("temperature", "top_p"):
        if params.get(key) is not None and not isinstance(params[key], (int, float)):
            raise ValueError(f"params.{key} must be a number")
    stop = params.get("stop")
    if (
        stop is not None
        and not isinstance(stop, str)
        and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise ValueError("params.stop must be a string or a list of strings")
    continue_from = frame.get("continue_from") or ""
    if not isinstance(continue_from, str):
        raise ValueError("continue_from must be a string")
    return GenerationRequest(
        model=model,
        messages=messages,
        prompt=prompt,
        params=params,
        continue_from=continue_from,
    )


def _frame_parse(message: str | bytes) -> dict[str, Any] | None:
    """Decode a frame; None (logged) when it is not a JSON object with a type."""
    try:
        frame = json.loads(message)
    except (ValueError, TypeError):
        log.warning("ignoring a frame that is not JSON: %.80r", message)
        return None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        log.warning("ignoring a frame without a type: %.80r", message)
        return None
    log.debug("received %s", _frame_summary(frame))
    return frame


def _frame_summary(frame: dict[str, Any]) -> str:
    summary = {
        k: v for k, v in frame.items() if k not in ("messages", "prompt", "devices")
    }
    return json.dumps(summary, ensure_ascii=False)[:200]


def _connect_exception(exc: Exception) -> Exception | None:
    """Which connection failures to retry (None) or raise (the exception).

    Beyond the library's defaults (network errors, 5xx), every refused handshake
    is retried with the library's backoff and logged clearly: a machine must come
    back by itself once its token is fixed or the coordinator is back.
    """
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        if status in (401, 403):
            log.error(
                "the coordinator refused the machine token (HTTP %s): check --token "
                "or BALLAST_MACHINE_TOKEN; retrying with backoff",
                status,
            )
        else:
            log.error(
                "the coordinator refused the connection (HTTP %s); retrying", status
            )
        return None
    if isinstance(exc, InvalidHandshake):
        log.error("websocket handshake failed: %s; retrying", exc)
        return None
    if isinstance(exc, (OSError, TimeoutError)):
        log.warning("cannot reach the coordinator: %s; retrying", exc)
        return None
    return exc


def _delays(min_s: float, max_s: float) -> Iterator[float]:
    """Exponential backoff with jitter: about min_s, 2·min_s, … up to max_s (s)."""
    delay = min_s
    while True:
        yield delay * random.uniform(0.8, 1.2)
        delay = min(max_s, delay * 2)


@contextlib.asynccontextmanager
async def _closing(stream: AsyncIterator[str]) -> AsyncIterator[AsyncIterator[str]]:
    """Close an engine stream however the iteration ends (stops the engine)."""
    try:
        yield stream
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
