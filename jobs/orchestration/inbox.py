"""A job's inbox: the messages of its reply channel (its hosts' frames, wake-ups),
as its coroutine reads them (DESIGN.md "How a request flows" step 4)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Iterator

from channels.exceptions import ChannelFull

# text of token messages delivered in-process (``ballast.local``) that may wait
# unread in a job's inbox, characters: a slow renter's backlog, before the host
# is cut off (the in-memory layer's bound is 5,000 messages)
LOCAL_INBOX_CHARS = 4_000_000


class JobInbox:
    """The messages waiting for a job's coroutine, in arrival order.

    Messages arrive through ``deliver``, registered with ``ballast.local``:
    straight from a sender in this process, or from another process by way of
    this process's mailbox. ``put`` adds one the job's coroutine makes itself
    (its lease lost).
    """

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.messages: deque[dict] = deque()
        self.arrived = asyncio.Event()
        self.chars = 0  # text of the token messages delivered locally, waiting

    def __iter__(self) -> Iterator[dict]:
        return iter(self.messages)

    def put(self, message: dict) -> None:
        """Add a message as it is (no join, no bound)."""
        self.messages.append(message)
        self.arrived.set()

    def extend(self, messages: Iterable[dict]) -> None:
        for message in messages:
            self.put(message)

    def deliver(self, message: dict) -> None:
        """Take a message for the job's channel (``ballast.local``).

        A token right after a token of the same attempt joins its text, so a fast
        host and a slow renter cost one message, not one per frame. Raises
        ChannelFull, as the layer would, when more than ``LOCAL_INBOX_CHARS`` of
        text waits unread: a sender in this process then closes the host's
        connection and the job fails over; one by way of the mailbox is dropped
        and logged (an honest host stops at ``max_tokens``, far below the bound).
        """
        messages = self.messages
        if message.get("type") == "host.token":
            text = message["text"]
            if self.chars + len(text) > LOCAL_INBOX_CHARS:
                raise ChannelFull(f"{self.channel}: {self.chars} characters unread")
            self.chars += len(text)
            last = messages[-1] if messages else None
            if (
                last is not None
                and last.get("local")
                and last.get("attempt") == message.get("attempt")
            ):
                last["text"] += text
                if "logprobs" in message:
                    last["logprobs"] = last.get("logprobs", []) + message["logprobs"]
                return
            message["local"] = True
        self.put(message)

    async def next(self, timeout: float) -> dict:
        """The next message; TimeoutError after ``timeout`` s without one."""
        if not self.messages:
            self.arrived.clear()
            async with asyncio.timeout(timeout):
                await self.arrived.wait()
        return self.take()

    def take(self) -> dict:
        """The first message, removed (a local token frees its text's bound)."""
        message = self.messages.popleft()
        if message.get("local"):
            self.chars -= len(message["text"])
        return message

    def more_text(
        self, attempt_id: str, *, at: int, logprobs: list[dict] | None = None
    ) -> str:
        """Text of this attempt's token messages waiting at the head that go on
        from character ``at`` of its text, taken: tokens that arrived together go
        to the renter as one chunk (a message relayed from another position is
        left for the caller to judge). Their ``logprobs`` entries are added to
        ``logprobs`` when given."""
        pieces = []
        while self.messages:
            head = self.messages[0]
            if head.get("type") != "host.token" or head.get("attempt") != attempt_id:
                break
            if head.get("at", at) != at:
                break
            message = self.take()
            text = message["text"]
            if logprobs is not None:
                logprobs.extend(message.get("logprobs", ()))
            pieces.append(text)
            at += len(text)
        return "".join(pieces)
