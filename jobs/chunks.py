"""OpenAI's response shapes for one job: streamed chunks (server-sent events or
renter websocket messages) and whole responses (PROTOCOL.md §1)."""

from __future__ import annotations

import json
import time

from .models import Job
from .requests import CompletionRequest


class ChunkWriter:
    """Builds OpenAI response objects (chunks and whole responses) for one job."""

    def __init__(self, job: Job, request: CompletionRequest) -> None:
        self.job = job
        self.chat = request.endpoint == Job.Endpoint.CHAT
        self.model = request.model
        self.created = int(time.time())
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{job.id}"
        self.first = True

    def _base(self, choices: list) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def chunk(self, text: str = "", finish_reason: str | None = None) -> dict:
        """A streamed chunk carrying ``text`` (and the finish reason, at the end)."""
        if self.chat:
            delta: dict = {"content": text} if text or finish_reason is None else {}
            if self.first:
                delta["role"] = "assistant"
                self.first = False
            choice = {
                "index": 0,
                "delta": delta,
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        return self._base([choice])

    def token_sse(self, text: str) -> bytes:
        """The server-sent event of a chunk carrying ``text``."""
        return sse(self.chunk(text))

    def token_json(self, text: str) -> str:
        """The renter websocket's message of a chunk carrying ``text``."""
        return json.dumps(self.chunk(text))

    def usage_chunk(self, usage: dict) -> dict:
        """The final usage chunk of ``stream_options.include_usage``."""
        return {**self._base([]), "usage": usage}

    def whole(self, text: str, finish_reason: str, usage: dict) -> dict:
        """A non-streamed response object."""
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
                "logprobs": None,
            }
            kind = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "finish_reason": finish_reason,
                "logprobs": None,
            }
            kind = "text_completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }


def sse(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
