"""The renter websocket ``/ws/v1/chat/`` (PROTOCOL.md §1).

Send one chat request as JSON; receive the same chunks as JSON messages, then
``{"type": "done", ...}``. Errors come as ``{"type": "error", "error": {...}}``.
Closing the socket cancels the running job (billed for what was delivered).
The key is checked when the socket opens and again with every request (in the
request's transaction, ``services.job_open``): a key revoked meanwhile, or a
renter deactivated, gets a 401 error message and the socket is closed. A key
revoked (or its renter deactivated) while the socket is open closes it at once,
its running job cancelled: the socket is in its key's group
(``services.api_key_group``), which ``services.api_keys_connections_close``
tells, from any coordinator process.

Open sockets are capped per key and per client address (past a cap: a 429
error message and close 4429), and a socket that has sent no request within
``BALLAST_HELLO_TIMEOUT_S`` is closed (a 408 error message, close 4408).
A socket opened while the database or Redis cannot be reached answers its
first request with a 503 to retry and closes (1013, try again later).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from contextlib import aclosing

from django.conf import settings

from ballast.consumers import (
    CLOSE_NO_GREETING,
    CLOSE_TOO_MANY,
    CLOSE_TRY_LATER,
    DirectDispatchConsumer,
)
from ballast.db import db_call
from ballast.sockets import SocketCap
from hosts.consumers import bearer_token

from ..chunks import ChunkWriter
from ..errors import LAYER_UNAVAILABLE, ApiError, error_body, failure_error
from ..orchestration import Failed, Finished, JobRun, Token, job_channel_open
from ..requests import completion_request_parse
from ..services import api_key_authenticate, api_key_group, job_open, unauthorized


class RenterChatConsumer(DirectDispatchConsumer):
    """One renter connection; runs one request at a time."""

    async def connect(self) -> None:
        self.plain_key = bearer_token(self.scope)
        self.task: asyncio.Task | None = None
        self.key_group = ""
        self.unavailable: ApiError | None = None
        try:
            key, full = await self._admitted()
        except Exception as exc:  # the database or Redis away (restarting)
            # answered at the socket's first request, a 503 to retry, as the
            # HTTP API answers (a 500 handshake was a cut connection)
            key, full = None, None
            self.unavailable = failure_error(exc, "renter websocket connect")
        await self.accept()
        if self.unavailable is not None:
            self.greeting_deadline_start()
        elif key is None:
            await self._refused()
        elif full is not None:
            await self._error(
                ApiError(
                    429,
                    f"too many open connections: at most {full.cap} per "
                    f"{full.kind} ({full.setting}); close one first",
                    "too_many_connections",
                )
            )
            await self.refuse(CLOSE_TOO_MANY)
        else:
            self.greeting_deadline_start()

    async def _admitted(self):
        """(the socket's live key or None, the socket cap that is full or
        None). Raises what the database or the channel layer raise."""
        key = await db_call(api_key_authenticate)(plain=self.plain_key)
        if key is None:
            return None, None
        # joined before the accept and re-checked after: a revoke that
        # committed in between is seen by one or the other
        group = api_key_group(key.id)
        await self.channel_layer.group_add(group, self.channel_name)
        self.key_group = group
        key = await db_call(api_key_authenticate)(plain=self.plain_key)
        if key is None:
            return None, None
        full = await self.sockets_take(
            SocketCap("key", str(key.id), "BALLAST_SOCKETS_PER_KEY")
        )
        return key, full

    async def greeting_deadline(self, message: dict) -> None:
        """``BALLAST_HELLO_TIMEOUT_S`` after the accept: a socket that has sent
        no request gets a 408 error message and is closed (4408)."""
        if self.task is None and not self.refused:
            timeout = settings.BALLAST_HELLO_TIMEOUT_S
            await self._error(
                ApiError(
                    408, f"no request within {timeout:g} s; closing", "request_timeout"
                )
            )
            await self.refuse(CLOSE_NO_GREETING)

    async def disconnect(self, code: int) -> None:
        await self._task_stop()
        if getattr(self, "key_group", ""):
            with contextlib.suppress(*LAYER_UNAVAILABLE):  # (its entry lapses)
                await self.channel_layer.group_discard(self.key_group, self.channel_name)

    async def _task_stop(self) -> None:
        """Cancel the running request, if any (its job billed for what was delivered)."""
        task = getattr(self, "task", None)
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def key_revoked(self, message: dict) -> None:
        """The key was revoked or its renter deactivated: stop the running
        request, say so (401) and close (4401)."""
        await self._task_stop()
        await self._refused()

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None
    ) -> None:
        if self.unavailable is not None:
            await self._error(self.unavailable)
            await self.refuse(CLOSE_TRY_LATER)
            return
        if self.task is not None and not self.task.done():
            await self._error(
                ApiError(429, "one request at a time per connection", "busy")
            )
            return
        if text_data is None:
            await self._error(
                ApiError(400, "send the request as a text message", "invalid_json")
            )
            return
        try:
            body = json.loads(text_data)
        except (ValueError, RecursionError):
            await self._error(
                ApiError(400, "message is not valid JSON", "invalid_json")
            )
            return
        if isinstance(body, dict):
            body = {**body, "stream": True}
        self.task = asyncio.create_task(self._run(body))

    async def _run(self, body) -> None:
        """Answer one request; the coordinator's own failure is an error message
        (503 to retry for the database, 500 otherwise), as the HTTP API answers."""
        try:
            await self._answer(body)
        except Exception as exc:
            await self._error(failure_error(exc, "renter websocket"))

    async def _answer(self, body) -> None:
        try:
            try:
                parsed = completion_request_parse(body, endpoint="chat")
            except ApiError:  # the key first: a caller without one learns nothing
                if await db_call(api_key_authenticate)(plain=self.plain_key) is None:
                    raise unauthorized() from None
                raise
            channel, (job, model, dispatch) = await job_channel_open(
                lambda channel: db_call(job_open)(
                    api_key=self.plain_key, request=parsed, waiting_channel=channel
                )
            )
        except ApiError as exc:
            if exc.status == 401:
                await self._refused()
            else:
                await self._error(exc)
            return
        writer = ChunkWriter(job, parsed)
        run = JobRun(job, model=model, channel=channel, dispatch=dispatch)
        async with aclosing(run.events()) as events:
            async for event in events:
                if isinstance(event, Token):
                    for chunk in writer.token_chunks(event.text, event.logprobs):
                        await self._send(chunk)
                    continue
                if isinstance(event, Failed) and not event.after_output:
                    await self._error(
                        ApiError(event.status, event.message, event.code),
                        job=str(job.id),
                    )
                    return
                if isinstance(event, Finished):
                    chunk = writer.chunk(finish_reason=event.finish_reason)
                    await self._send(chunk)
                    finish = chunk["choices"][0]["finish_reason"]  # tool_calls
                else:
                    chunk = writer.chunk(finish_reason="error")
                    chunk["error"] = error_body(
                        event.status, event.message, event.code
                    )["error"]
                    await self._send(chunk)
                    finish = "error"
                await self._send(
                    {
                        "type": "done",
                        "job": str(job.id),
                        "finish_reason": finish,
                        "usage": event.usage,
                    }
                )
                return

    async def _refused(self) -> None:
        """The key is not (or no longer) live: say so and close (4401)."""
        await self._error(unauthorized())
        await self.refuse(4401)

    async def _send(self, content: dict) -> None:
        await self.send(text_data=json.dumps(content))

    async def _error(self, error: ApiError, **extra) -> None:
        """Send ``{"type": "error", "status", **extra, "error": {...}}`` (and
        ``retry_after``, s, with a 429 of a limit)."""
        if error.retry_after_s is not None:
            extra["retry_after"] = error.retry_after_s
        await self._send(
            {"type": "error", "status": error.status, **extra, **error.body()}
        )
