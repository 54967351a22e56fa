"""``ballast.asgi.HeadersWithFirstBody``: a response's headers held (``TCP_CORK``)
until its first body is written, on a real loopback TCP connection."""

from __future__ import annotations

import asyncio
import socket

import pytest
import pytest_asyncio

from ballast.asgi import HeadersWithFirstBody

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


class _Server:
    """A stand-in for uvicorn's request cycle: ``send`` is a bound method of an
    object with the connection's ``transport`` (a real TCP connection), and
    records whether the socket held its output (``TCP_CORK``) at each message."""

    def __init__(self, transport) -> None:
        self.transport = transport
        self.held_at: list[tuple[str, int]] = []

    async def send(self, message: dict) -> None:
        sock = self.transport.get_extra_info("socket")
        held = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK)
        self.held_at.append((message["type"], held))
        self.transport.write(message.get("body", b"") or b"h")


@pytest_asyncio.fixture
async def tcp_transport():
    """The server side of a real loopback TCP connection (asyncio's transport)."""
    accepted: asyncio.Future = asyncio.get_running_loop().create_future()

    async def on_client(reader, writer):
        accepted.set_result(writer)

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, client = await asyncio.open_connection("127.0.0.1", port)
    writer = await accepted
    yield writer.transport
    client.close()
    writer.close()
    server.close()
    await server.wait_closed()


@pytest.fixture
def corked(tcp_transport):
    """(the stand-in server, its ``send`` wrapped, the connection's socket)."""
    if not hasattr(socket, "TCP_CORK"):
        pytest.skip("Linux TCP_CORK")
    server = _Server(tcp_transport)
    return (
        server,
        HeadersWithFirstBody(server.send),
        tcp_transport.get_extra_info("socket"),
    )


@pytest.mark.django_db(transaction=False)
async def test_response_headers_are_held_until_the_first_body_is_written(corked):
    server, send, sock = corked
    await send({"type": "http.response.start", "status": 200, "headers": []})
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 1
    await send({"type": "http.response.body", "body": b"first", "more_body": True})
    # written while held, then let go: headers and first chunk in one segment
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0
    await send({"type": "http.response.body", "body": b"second", "more_body": True})
    send.release()  # nothing held: a no-op
    assert server.held_at == [
        ("http.response.start", 1),
        ("http.response.body", 1),
        ("http.response.body", 0),
    ]


@pytest.mark.django_db(transaction=False)
async def test_a_response_that_ends_without_a_body_lets_its_headers_go(
    corked, tcp_transport
):
    _, send, sock = corked
    await send({"type": "http.response.start", "status": 200, "headers": []})
    send.release()
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0
    tcp_transport.close()
    send.release()  # a closed connection: nothing to do, no error


@pytest.mark.django_db(transaction=False)
async def test_a_send_without_a_socket_goes_straight_through():
    sent = []

    async def send(message):
        sent.append(message["type"])

    wrapped = HeadersWithFirstBody(send)
    await wrapped({"type": "http.response.start", "status": 200, "headers": []})
    await wrapped({"type": "http.response.body", "body": b"x"})
    wrapped.release()
    assert sent == ["http.response.start", "http.response.body"]
    assert wrapped.socket is None and not wrapped.held
