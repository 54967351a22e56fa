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
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Subprotocol

from agent import __version__
from agent.engines.base import Engine, ModelLoadError
from agent.session import Session
from agent.telemetry import Telemetry

log = logging.getLogger(__name__)

SUBPROTOCOL = Subprotocol("ballast.host.v1")
WS_PATH = "/ws/host/"
CLOSE_UNAUTHORIZED = 4401
CLOSE_REPLACED = 4409  # another connection of this machine took over
CLOSE_NO_PROOF = 4426  # a hello without the challenge's proof (an older agent)
CLOSE_NO_HELLO = 4408  # no hello within the coordinator's BALLAST_HELLO_TIMEOUT_S
CLOSE_TOO_MANY = 4429  # too many open connections of this machine or address
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
        self.session: Session | None = None  # the connection being served
        self.draining = False  # stopping: heartbeats say paused (``drain``)
        self.drain_task: asyncio.Task[None] | None = None  # set by the CLI

    async def drain(self, timeout_s: float) -> int:
        """Stop taking work and let the running jobs finish, for up to
        ``timeout_s`` s; return how many were still running then (0: all done).

        The next heartbeat, sent at once, says ``paused``, so the coordinator
        offers this machine nothing new (an offer already crossing it is still
        served). A host stopping its agent mid-answer otherwise has the job
        fail over: the segment unpaid, a death mid-stream on its score.
        """
        self.draining = True
        session = self.session
        if session is None:
            return 0
        with contextlib.suppress(ConnectionClosed):
            await session.send(session.heartbeat_frame())
        deadline = asyncio.get_running_loop().time() + timeout_s
        while session.jobs:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            log.info(
                "stopping: %d job(s) still running; waiting up to %.0f s",
                len(session.jobs),
                left,
            )
            await asyncio.wait(set(session.jobs.values()), timeout=left)
        return len(session.jobs)

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

        A handshake refused by the coordinator (HTTP 401/403: bad token), a
        session closed before ``welcome`` (close code 4401; 4429, too many open
        connections; 4408, no hello in time) and a session closed because
        another agent connected as this machine (4409) are retried with a
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
            if welcomed and ws.close_code != CLOSE_REPLACED:
                refusals = _delays(self.config.retry_min_s, self.config.retry_max_s)
                log.info("disconnected from %s; reconnecting", url)
                continue
            # refused, or replaced by another agent of this machine: taking the
            # machine back at once would replace that one, which would do the
            # same, in a tight loop; the delay grows while it goes on
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
            session = Session(self, ws)
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
        session = Session(self, ws)
        try:
            if not await session.open():
                return False
            log.info("connected to %s as machine %s", url, self.machine_id)
            self.session = session
            self.connected.set()
            with contextlib.suppress(ConnectionClosed):
                await session.serve()
            return True
        finally:
            self.connected.clear()
            self.session = None
            await session.shutdown()

    def _log_close(self, ws: ClientConnection, welcomed: bool) -> None:
        code, reason = ws.close_code, ws.close_reason or ""
        if code == CLOSE_UNAUTHORIZED:
            log.error(
                "the coordinator refused this machine (close code 4401 %s): "
                "check the machine token (--token or BALLAST_MACHINE_TOKEN)",
                reason,
            )
        elif code == CLOSE_REPLACED:
            log.error(
                "another agent connected as this machine and took over (close code "
                "4409): run one agent per machine token; this one backs off"
            )
        elif code == CLOSE_NO_PROOF:
            log.error(
                "the coordinator wants the hello to sign its challenge (close code "
                "4426 %s): upgrade this agent",
                reason,
            )
        elif code == CLOSE_TOO_MANY:
            log.error(
                "the coordinator refused the connection: too many open connections "
                "of this machine or this address (close code 4429 %s); another "
                "agent may run with this token, or dropped connections are not "
                "closed yet: this one backs off",
                reason,
            )
        elif code == CLOSE_NO_HELLO:
            log.error(
                "the coordinator closed the connection: no hello in time (close "
                "code 4408 %s); backing off",
                reason,
            )
        elif code is not None and 4000 <= code < 5000:
            log.error("the coordinator closed the connection: code %s %s", code, reason)
        elif not welcomed:
            log.warning(
                "the connection closed before welcome (code %s %s)", code, reason
            )


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
