"""Access and availability (issue 32 item 6), on real coordinator processes:
the admin's login is rate limited like the site's; a websocket that has not
said ``hello`` (host) or sent a request (renter) within
``BALLAST_HELLO_TIMEOUT_S`` is closed (4408); open websockets per machine, per
API key and per client address are capped (4429), counted across processes
in Redis and not left stuck by a process that died.

With ``REDIS_URL`` and PostgreSQL the stack runs two coordinator processes and
the clients alternate between them (the counts must be shared); on the
embedded default one process counts in its memory. Other client addresses
are loopback ones (``127.0.0.2``), bound by the client.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from agent.receipts import challenge_sign, public_key_b64
from ballast.stack import Stack, last_line, manage

pytestmark = pytest.mark.e2e

WAIT_S = 20.0  # the most any expected frame or close may take
PASSWORD = "a long staff passphrase 42"


def _two_processes() -> bool:
    return bool(os.environ.get("REDIS_URL")) and os.environ.get(
        "DATABASE_URL", ""
    ).startswith(("postgres://", "postgresql://"))


@contextmanager
def coordinators(env: dict[str, str], log_dir, **settings: str) -> Iterator[tuple]:
    """A migrated stack with ``settings`` added to its environment and one
    coordinator process, two when Redis and PostgreSQL are there. Yields
    ``(stack, [url, …])``."""
    with Stack(env={**env, **settings}, log_dir=log_dir) as stack:
        stack.migrate()
        urls = [stack.start_coordinator()]
        if _two_processes():
            urls.append(stack.start_coordinator("coordinator-b"))
        yield stack, urls


def machine_token(stack: Stack, name: str) -> str:
    return last_line(manage("machine_create", "host@example.com", name, env=stack.env))


def renter_key(stack: Stack, email: str) -> str:
    return last_line(manage("renter_create", email, "--credit", "1", env=stack.env))


async def open_socket(
    url: str, path: str, secret: str, *, address: str = "127.0.0.1"
) -> ClientConnection:
    """A websocket to ``path`` of the coordinator at ``url``, with a bearer
    ``secret``, from the loopback ``address``."""
    return await connect(
        url.replace("http://", "ws://") + path,
        additional_headers={"Authorization": f"Bearer {secret}"},
        subprotocols=["ballast.host.v1"] if path == "/ws/host/" else None,
        local_addr=(address, 0),
        open_timeout=WAIT_S,
    )


async def frame(ws: ClientConnection) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))


async def closed_with(ws: ClientConnection) -> int | None:
    """Wait until the coordinator closed ``ws``; its close code."""
    await asyncio.wait_for(ws.wait_closed(), WAIT_S)
    return ws.close_code


async def host_open(url: str, token: str, *, address: str = "127.0.0.1") -> tuple:
    """A machine's socket; ``(socket, first frame)``: a ``challenge`` when it
    was admitted, an ``error`` when refused."""
    ws = await open_socket(url, "/ws/host/", token, address=address)
    return ws, await frame(ws)


async def renter_open(url: str, key: str, *, address: str = "127.0.0.1") -> tuple:
    """A renter's socket that sends an empty request; ``(socket, answer)``: a
    400 error when it was admitted (the request was read), a 429 when refused."""
    ws = await open_socket(url, "/ws/v1/chat/", key, address=address)
    try:
        await ws.send("{}")
    except ConnectionClosed:
        pass  # refused and closed before the request left: the answer came first
    return ws, await frame(ws)


def assert_refused_too_many(message: dict, setting: str) -> None:
    text = message.get("message") or message.get("error", {}).get("message", "")
    assert "too many open connections" in text and setting in text, message


@pytest.mark.asyncio
async def test_a_socket_that_says_nothing_is_closed(e2e_env, tmp_path) -> None:
    """Within ``BALLAST_HELLO_TIMEOUT_S`` (1 s here): a machine's socket that
    got its challenge and never said hello gets an error frame and close 4408;
    a renter's socket that sent no request a 408 error and 4408; a machine
    that says hello in time stays connected."""
    with coordinators(e2e_env, tmp_path / "logs", BALLAST_HELLO_TIMEOUT_S="1") as (
        stack,
        urls,
    ):
        token, key = machine_token(stack, "quiet"), renter_key(stack, "r@example.com")
        silent, challenge = await host_open(urls[0], token)
        assert challenge["type"] == "challenge"
        error = await frame(silent)
        assert error["type"] == "error" and "no hello within 1 s" in error["message"]
        assert await closed_with(silent) == 4408

        renter = await open_socket(urls[-1], "/ws/v1/chat/", key)
        answer = await frame(renter)
        assert answer["type"] == "error" and answer["status"] == 408
        assert answer["error"]["code"] == "request_timeout"
        assert await closed_with(renter) == 4408

        signing = Ed25519PrivateKey.generate()
        greeted, challenge = await host_open(urls[-1], token)
        await greeted.send(
            json.dumps(
                {
                    "type": "hello",
                    "agent_version": "test",
                    "engine": {"name": "scripted", "version": "1"},
                    "public_key": public_key_b64(signing),
                    "proof": challenge_sign(signing, challenge["nonce"]),
                    "accepts_serverless": True,
                    "devices": [{"index": 0, "name": "GPU", "vram_total_mb": 8192}],
                }
            )
        )
        assert (await frame(greeted))["type"] == "welcome"
        with pytest.raises(TimeoutError):  # an observation window past the deadline
            await asyncio.wait_for(greeted.wait_closed(), 2.5)
        await greeted.close()


@pytest.mark.asyncio
async def test_open_sockets_are_capped_per_machine_key_and_address(
    e2e_env, tmp_path
) -> None:
    """Caps 2 per machine, 2 per key, 5 per address, the sockets spread over
    the processes: the one past a cap is refused with close 4429 (an error
    naming the setting); another address is not held to the first one's
    count; a socket closed frees its place."""
    with coordinators(
        e2e_env,
        tmp_path / "logs",
        BALLAST_SOCKETS_PER_MACHINE="2",
        BALLAST_SOCKETS_PER_KEY="2",
        BALLAST_SOCKETS_PER_ADDRESS="5",
        BALLAST_HELLO_TIMEOUT_S="120",
    ) as (stack, urls):
        one, two = machine_token(stack, "one"), machine_token(stack, "two")
        key = renter_key(stack, "r@example.com")

        def url(i: int) -> str:
            return urls[i % len(urls)]

        held = []
        for i in range(2):
            ws, first = await host_open(url(i), one)
            assert first["type"] == "challenge"
            held.append(ws)
        ws, first = await host_open(url(2), one)
        assert_refused_too_many(first, "BALLAST_SOCKETS_PER_MACHINE")
        assert await closed_with(ws) == 4429

        for i in range(2):
            ws, answer = await renter_open(url(i), key)
            assert answer["status"] == 400, answer  # admitted: its request read
            held.append(ws)
        ws, answer = await renter_open(url(2), key)
        assert answer["status"] == 429, answer
        assert answer["error"]["code"] == "too_many_connections"
        assert_refused_too_many(answer, "BALLAST_SOCKETS_PER_KEY")
        assert await closed_with(ws) == 4429

        # 127.0.0.1 holds 4 of its 5
        ws, first = await host_open(url(1), two)
        assert first["type"] == "challenge"
        held.append(ws)
        ws, first = await host_open(url(0), two)
        assert_refused_too_many(first, "BALLAST_SOCKETS_PER_ADDRESS")
        assert await closed_with(ws) == 4429
        elsewhere, first = await host_open(url(0), two, address="127.0.0.2")
        assert first["type"] == "challenge"  # another address, its own count

        # machine "one" closes a socket on one process; the place is free on any
        await held[0].close()
        for _ in range(int(WAIT_S * 10)):  # the release lands just after the close
            ws, first = await host_open(url(1), one, address="127.0.0.3")
            if first["type"] == "challenge":
                break
            await closed_with(ws)
            await asyncio.sleep(0.1)
        assert first["type"] == "challenge", first
        for socket in (*held, elsewhere, ws):
            await socket.close()


@pytest.mark.asyncio
@pytest.mark.skipif(
    not _two_processes(),
    reason="a count outliving its process needs two processes: REDIS_URL and PostgreSQL",
)
async def test_a_dead_process_s_sockets_stop_counting(e2e_env, tmp_path) -> None:
    """A live socket keeps its place past many leases (its process renews it);
    when its process is SIGKILLed (nothing released), the place comes free
    within about a lease (2 s here) for a socket on the other process."""
    with coordinators(
        e2e_env,
        tmp_path / "logs",
        BALLAST_SOCKETS_PER_MACHINE="1",
        BALLAST_SOCKET_LEASE_S="2",
        BALLAST_HELLO_TIMEOUT_S="120",
    ) as (stack, urls):
        token = machine_token(stack, "rig")
        held, first = await host_open(urls[1], token)
        assert first["type"] == "challenge"
        await asyncio.sleep(5)  # an observation window of two and a half leases
        ws, first = await host_open(urls[0], token)
        assert_refused_too_many(first, "BALLAST_SOCKETS_PER_MACHINE")
        assert await closed_with(ws) == 4429

        stack.kill("coordinator-b")
        loop = asyncio.get_running_loop()
        killed = loop.time()
        while True:
            ws, first = await host_open(urls[0], token)
            if first["type"] == "challenge":
                break
            await closed_with(ws)
            assert loop.time() - killed < 2 + 5, "the dead process's count stuck"
            await asyncio.sleep(0.2)
        await ws.close()


def _login(client: httpx.Client, url: str, path: str, username: str) -> httpx.Response:
    """POST a login form at ``path`` (its CSRF token read from the page first)."""
    page = client.get(url + path)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    return client.post(
        url + path,
        data={
            "csrfmiddlewaretoken": token.group(1),
            "username": username,
            "password": "not the password",
        },
        headers={"Referer": url + path},
    )


def test_the_admin_login_is_rate_limited_like_the_sites(e2e_env, tmp_path) -> None:
    """``BALLAST_LOGIN_RATE`` (3/minute here) holds on ``/admin/login/``, per
    address and per account, across processes, and one count serves both login
    forms: the fourth wrong password gets a 429 with ``Retry-After``."""
    with coordinators(e2e_env, tmp_path / "logs", BALLAST_LOGIN_RATE="3/minute") as (
        stack,
        urls,
    ):
        manage(
            "createsuperuser",
            "--noinput",
            env={
                **stack.env,
                "DJANGO_SUPERUSER_USERNAME": "staff",
                "DJANGO_SUPERUSER_EMAIL": "staff@example.com",
                "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
            },
        )
        here = httpx.Client(timeout=WAIT_S)
        for i in range(3):
            answer = _login(here, urls[i % len(urls)], "/admin/login/", "staff")
            assert answer.status_code == 200, answer.status_code  # the form again
        refused = _login(here, urls[-1], "/admin/login/", "staff")
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        # the site's own login from this address: the same count
        site = _login(here, urls[0], "/accounts/login/", "someone@example.com")
        assert site.status_code == 429
        # the same account from another address: refused per account
        elsewhere = httpx.Client(
            timeout=WAIT_S, transport=httpx.HTTPTransport(local_address="127.0.0.2")
        )
        assert _login(elsewhere, urls[0], "/admin/login/", "staff").status_code == 429
