"""An answer's way out of the agent: its pieces as ``token`` frames, the claim
sent with the first one when the engine is quick (PROTOCOL.md §2)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from agent.engines.base import Piece

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

    from agent.session import Session

CLAIM_WITH_FIRST_PIECE_S = 0.002
"""How long a claim waits for the engine's first piece to leave with it, in one
TCP segment (s): an engine that answers at once (a cached prefix, a scripted
engine) costs the coordinator one wake-up instead of two; a slower one's claim
leaves after this wait, far inside the 5 s claim deadline (DESIGN.md)."""


class Outbox:
    """An answer's pieces on their way out as ``token`` frames, in order.

    The pieces an engine yields within one turn of the event loop leave as one
    frame: they would leave in one write all the same (uvloop makes a
    connection's writes at the end of its loop's turn), so joining them costs no
    time, and saves this agent and the coordinator a frame each (the
    benchmark's engine answering at once: 2 token frames, not 13;
    docs/performance.md, tenth round). A
    token may be any text of at least one character (PROTOCOL.md §2). Pieces
    that come apart leave apart, as they come. ``full()`` bounds what waits
    while a frame is being sent (a slow connection): the job's loop then waits
    for it (``flush``), as it waited for each send before.
    """

    MAX_PIECES = 64

    def __init__(self, session: Session, job: str, *, logprobs: bool = False) -> None:
        """``logprobs``: the job's offer asked for them, so every ``token``
        frame carries its pieces' entries (``Piece.logprobs``; maybe none)."""
        self.session, self.job = session, job
        self.logprobs = logprobs
        self.pieces: list[str] = []
        self.entries: list[dict[str, Any]] = []
        self.sender: asyncio.Task[None] | None = None

    def frame(self, text: str, entries: list[dict[str, Any]] | None = None) -> dict:
        """The ``token`` frame of ``text`` (with its tokens' ``entries``)."""
        frame: dict[str, Any] = {"type": "token", "job": self.job, "text": text}
        if self.logprobs:
            frame["logprobs"] = list(entries or ())
        return frame

    def add(self, piece: str) -> None:
        """Queue ``piece``; it leaves when the job's loop next gives way."""
        self.pieces.append(piece)
        if self.logprobs:
            self.entries.extend(piece_logprobs(piece))
        if self.sender is None or self.sender.done():
            if self.sender is not None:
                self.sender.result()  # a failed send (ConnectionClosed) raises here
            self.sender = asyncio.ensure_future(self._send())

    def full(self) -> bool:
        """Whether the job's loop should wait for what is queued (``flush``)."""
        return len(self.pieces) >= self.MAX_PIECES

    async def flush(self) -> None:
        """Return once every queued piece has been sent; raises what sending
        raised (``ConnectionClosed``)."""
        while self.sender is not None:
            sender = self.sender
            await sender  # it sends until nothing is queued
            if sender is self.sender:  # no other began meanwhile
                return

    def cancel(self) -> None:
        """Stop sending (the job ended or was cancelled: nothing more leaves)."""
        if self.sender is None:
            return
        if not self.sender.done():
            self.sender.cancel()
        elif not self.sender.cancelled():
            self.sender.exception()  # seen: the job's end has dealt with it

    async def _send(self) -> None:
        while self.pieces:
            text = "".join(self.pieces)
            self.pieces.clear()
            entries, self.entries = self.entries, []
            await self.session.send(self.frame(text, entries))


def piece_logprobs(piece: str) -> list[dict[str, Any]]:
    """The log-probability entries an engine's piece carries (``Piece``)."""
    return list(getattr(piece, "logprobs", None) or ())


def sendable(piece) -> str:
    """The text of an engine's piece as a ``token`` frame carries it: "" for
    anything but text; NUL characters dropped (the coordinator refuses a frame
    holding one: PostgreSQL text cannot store it, PROTOCOL.md §2 via
    ``hosts.protocol``), from its tokens' entries too. The receipt signs the
    text as sent, so an engine that emits a NUL still gets its answer paid."""
    if not isinstance(piece, str):
        return ""
    if "\x00" not in piece:
        return piece
    text = piece.replace("\x00", "")
    if not isinstance(piece, Piece):
        return text
    entries = []
    for entry in piece.logprobs:
        raw = [b for b in entry.get("bytes", ()) if b != 0]
        if raw:
            token = str(entry.get("token", "")).replace("\x00", "")
            entries.append({**entry, "token": token, "bytes": raw})
    return Piece(text, entries)


async def first_piece(
    pieces: AsyncIterator[str], session: Session, claim: dict[str, Any], outbox: Outbox
) -> str:
    """Start the engine, send ``claim`` — with the first piece's ``token`` frame
    (``outbox.frame``) when the engine yields it within
    ``CLAIM_WITH_FIRST_PIECE_S`` — and return
    that first piece once sent ("" when the stream ended without one).

    Pieces that are not non-empty text (``sendable``) are skipped, as the
    stream's loop does.
    The claim always leaves first, also when the engine fails (its error
    follows) or the job is cancelled meanwhile (then nothing more is sent).
    """

    async def next_text() -> str:
        async for piece in pieces:
            piece = sendable(piece)
            if piece:
                return piece
        return ""

    first = asyncio.ensure_future(next_text())
    try:
        done, _ = await asyncio.wait({first}, timeout=CLAIM_WITH_FIRST_PIECE_S)
        if first in done and first.exception() is None and first.result():
            piece = first.result()
            await session.send(claim, outbox.frame(piece, piece_logprobs(piece)))
            return piece
        await session.send(claim)
        piece = await first
        if piece:
            await session.send(outbox.frame(piece, piece_logprobs(piece)))
        return piece
    finally:
        if not first.done():  # cancelled: stop the engine's first step first
            first.cancel()
            await asyncio.wait({first})


@contextlib.contextmanager
def corked(ws: ClientConnection, cork: bool):
    """Hold the socket's output while the block writes (Linux ``TCP_CORK``), so
    its frames leave in one segment; a no-op when ``cork`` is false or the
    platform or transport has no such option."""
    transport = getattr(ws, "transport", None) if cork else None
    sock = transport.get_extra_info("socket") if transport is not None else None
    option = getattr(socket, "TCP_CORK", None)
    if sock is None or option is None:
        yield
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, 1)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, option, 0)
