"""Fixtures of the agent's tests, and a tiny stand-in for the coordinator.

No Django here: the agent imports nothing from the coordinator. The stand-in
(``FakeCoordinator``) speaks the coordinator's side of ``ballast.host.v1`` on
127.0.0.1 (a random port): checks the bearer token, answers ``hello`` with
``welcome`` and records every frame the agent sends. Tests wait on frames with
asyncio timeouts, never with sleeps.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

SUBPROTOCOL = Subprotocol("ballast.host.v1")
TIMEOUT_S = 10.0


class FakeCoordinator:
    """Plays the coordinator for one agent at a time.

    ``refuse_http``: answer the handshake with HTTP 403. ``close_code``: accept,
    then close at once with this code (no welcome). ``replace``: send
    ``welcome``, then close with 4409 (another agent took the machine over).
    Each connection first gets a ``challenge`` (``nonces``), as the real one.
    ``heartbeat_interval_s`` is sent in ``welcome``.
    """

    def __init__(
        self,
        *,
        token: str = "machine-token",
        heartbeat_interval_s: float = 0.2,
        refuse_http: bool = False,
        close_code: int | None = None,
        replace: bool = False,
    ) -> None:
        self.token = token
        self.heartbeat_interval_s = heartbeat_interval_s
        self.refuse_http = refuse_http
        self.close_code = close_code
        self.replace = replace
        # monotonic time (s) of each connection attempt, as a list and a queue
        self.attempts: list[float] = []
        self.attempt_times: asyncio.Queue[float] = asyncio.Queue()
        self.hellos: list[dict[str, Any]] = []
        self.nonces: list[str] = []  # the challenge sent on each connection
        self.headers: list[dict[str, str]] = []
        self.frames: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.heartbeats: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.connected = asyncio.Event()
        self.disconnected = asyncio.Event()
        self.ws: ServerConnection | None = None
        self._server: Any = None

    async def __aenter__(self) -> FakeCoordinator:
        self._server = await serve(
            self._handle,
            "127.0.0.1",
            0,
            subprotocols=[SUBPROTOCOL],
            process_request=self._process_request,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        """The coordinator base URL to give the agent (``http://127.0.0.1:port``)."""
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def _process_request(self, connection: ServerConnection, request: Any) -> Any:
        self.attempts.append(time.monotonic())
        self.attempt_times.put_nowait(self.attempts[-1])
        self.headers.append(dict(request.headers.raw_items()))
        if (
            self.refuse_http
            or request.headers.get("Authorization") != f"Bearer {self.token}"
        ):
            return connection.respond(HTTPStatus.FORBIDDEN, "bad machine token\n")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        if self.close_code is not None:
            await ws.close(self.close_code, "unauthorized")
            return
        nonce = f"nonce-{len(self.attempts)}"
        self.nonces.append(nonce)
        await ws.send(json.dumps({"type": "challenge", "nonce": nonce}))
        hello = json.loads(await ws.recv())
        self.hellos.append(hello)
        self.ws = ws
        self.disconnected.clear()
        await ws.send(
            json.dumps(
                {
                    "type": "welcome",
                    "machine_id": f"machine-{len(self.hellos)}",
                    "heartbeat_interval_s": self.heartbeat_interval_s,
                }
            )
        )
        self.connected.set()
        if self.replace:
            await ws.close(4409, "another connection of this machine took over")
        try:
            async for message in ws:
                frame = json.loads(message)
                if frame.get("type") == "heartbeat":
                    self.heartbeats.put_nowait(frame)
                else:
                    self.frames.put_nowait(frame)
        except ConnectionClosed:
            pass
        finally:
            self.connected.clear()
            self.disconnected.set()

    async def send(self, frame: dict[str, Any] | str) -> None:
        """Send a frame (a dict as JSON, a str as is) to the connected agent."""
        assert self.ws is not None, "no agent connected"
        await self.ws.send(frame if isinstance(frame, str) else json.dumps(frame))

    async def expect(
        self, kind: str, timeout: float = TIMEOUT_S, **fields: Any
    ) -> dict[str, Any]:
        """The next non-heartbeat frame; assert its type (and given fields)."""
        frame = await asyncio.wait_for(self.frames.get(), timeout)
        assert frame["type"] == kind, f"expected {kind}, got {frame}"
        for key, value in fields.items():
            assert frame.get(key) == value, f"expected {key}={value!r} in {frame}"
        return frame

    async def heartbeat(self, timeout: float = TIMEOUT_S) -> dict[str, Any]:
        """The next heartbeat frame."""
        return await asyncio.wait_for(self.heartbeats.get(), timeout)

    async def receive_nothing(self, timeout: float = 0.3) -> None:
        """Assert no non-heartbeat frame arrives within ``timeout`` seconds."""
        try:
            frame = await asyncio.wait_for(self.frames.get(), timeout)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected frame {frame}")

    async def stream_collect(
        self, job: str, timeout: float = TIMEOUT_S
    ) -> tuple[str, dict[str, Any]]:
        """Read ``token`` frames of ``job`` up to its ``done``: (text, done frame).

        Fails on an ``error`` frame or a frame of another job.
        """
        pieces = []
        while True:
            frame = await asyncio.wait_for(self.frames.get(), timeout)
            assert frame.get("job") == job, f"frame of another job: {frame}"
            if frame["type"] == "token":
                assert isinstance(frame["text"], str) and frame["text"], frame
                pieces.append(frame["text"])
            elif frame["type"] == "done":
                return "".join(pieces), frame
            else:
                raise AssertionError(f"unexpected frame {frame}")


def _offer_frame(
    job: str, *, model: str = "smollm2-135m-instruct", **extra: Any
) -> dict[str, Any]:
    """An ``offer`` frame for a chat job (``extra`` overrides fields)."""
    frame = {
        "type": "offer",
        "job": job,
        "device": 0,
        "model": model,
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        "params": {
            "max_tokens": 64,
            "temperature": 0,
            "top_p": 1,
            "stop": None,
            "seed": 1,
        },
        "continue_from": "",
    }
    frame.update(extra)
    return frame


@pytest.fixture
def offer_frame() -> Callable[..., dict[str, Any]]:
    """Builds ``offer`` frames: ``offer_frame("job-1", params={...})``."""
    return _offer_frame


@pytest.fixture(scope="session")
def llama_engine() -> Any:
    """The real llama.cpp engine with SmolLM2-135M-Instruct, loaded once."""
    from agent.engines.llamacpp import LlamaCppEngine

    engine = LlamaCppEngine()
    asyncio.run(engine.load())
    return engine


@pytest.fixture
def coordinator_class() -> type[FakeCoordinator]:
    """The ``FakeCoordinator`` class, for tests that need other settings."""
    return FakeCoordinator


@pytest_asyncio.fixture
async def coordinator() -> AsyncIterator[FakeCoordinator]:
    """A running fake coordinator with default settings."""
    async with FakeCoordinator() as fake:
        yield fake


AgentStart = Callable[..., Awaitable[Any]]


@pytest_asyncio.fixture
async def agent_start(tmp_path: Path) -> AsyncIterator[AgentStart]:
    """Starts agents against a fake coordinator; stops them at teardown.

    ``await agent_start(coordinator, script={...}, slots=1, engine=None)`` loads
    the engine (scripted by default), runs the agent as a task, waits for its
    ``welcome`` and returns the ``HostAgent``.
    """
    from agent.client import AgentConfig, HostAgent
    from agent.engines.scripted import ScriptedEngine
    from agent.receipts import key_load_or_create

    tasks: list[asyncio.Task[None]] = []

    async def start(
        fake: FakeCoordinator,
        *,
        script: dict[str, Any] | None = None,
        engine: Any = None,
        slots: int = 1,
        wait: bool = True,
        **config: Any,
    ) -> Any:
        agent = HostAgent(
            config=AgentConfig(
                server_url=fake.url, token=fake.token, slots=slots, **config
            ),
            engine=engine or ScriptedEngine(script),
            key=key_load_or_create(tmp_path / f"key-{len(tasks)}.pem"),
        )
        await agent.load()
        tasks.append(asyncio.create_task(agent.run()))
        if wait:
            await asyncio.wait_for(fake.connected.wait(), TIMEOUT_S)
        return agent

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
