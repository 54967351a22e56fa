"""OpenAI's response shapes for one job: streamed chunks (server-sent events or
renter websocket messages) and whole responses (PROTOCOL.md §1)."""

from __future__ import annotations

import json
import time

from .models import Job
from .requests import CompletionRequest
from .toolcalls.answers import ToolAnswer


class ChunkWriter:
    """Builds OpenAI response objects (chunks and whole responses) for one job.

    ``logprobs`` arguments are the tokens' entries as hosts send them
    (``hosts.logprobs.parse_token_logprobs``: OpenAI's chat shape), or None
    when the request asked for none; a completion's become OpenAI's
    completions shape (``tokens``, ``token_logprobs``, ``top_logprobs``,
    ``text_offset``: characters from the start of the prompt, as OpenAI and
    llama.cpp count them).
    """

    def __init__(self, job: Job, request: CompletionRequest) -> None:
        self.job = job
        self.chat = request.endpoint == Job.Endpoint.CHAT
        self.model = request.model
        self.created = int(time.time())
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{job.id}"
        self.first = True
        self.offset = len(request.prompt or "")  # the next token's text_offset
        # a request with tools: its text is parsed into tool calls (jobs.toolcalls)
        # in the format its job was given for its model
        self.tool_format = (job.params or {}).get("tool_format") if self.chat else None
        self.tools = ToolAnswer(self.tool_format) if self.tool_format else None

    def logprobs(self, entries: list[dict] | None) -> dict | None:
        """A choice's ``logprobs`` object for ``entries`` (None: not asked)."""
        if entries is None:
            return None
        if self.chat:
            return {"content": entries, "refusal": None}
        offsets = []
        for entry in entries:
            offsets.append(self.offset)
            # characters: the bytes that begin one (not UTF-8 continuations)
            self.offset += sum(1 for b in entry["bytes"] if b & 0xC0 != 0x80)
        return {
            "tokens": [entry["token"] for entry in entries],
            "token_logprobs": [entry["logprob"] for entry in entries],
            "top_logprobs": [
                {alt["token"]: alt["logprob"] for alt in entry["top_logprobs"]}
                for entry in entries
            ],
            "text_offset": offsets,
        }

    def _base(self, choices: list) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def chunk(
        self,
        text: str = "",
        finish_reason: str | None = None,
        logprobs: list[dict] | None = None,
    ) -> dict:
        """A streamed chunk carrying ``text`` and its tokens' ``logprobs`` (and
        the finish reason, at the end: ``tool_calls`` for a request with tools
        whose answer called)."""
        if self.tools is not None and finish_reason is not None:
            held = "".join(d["content"] for d in self.tools.end())
            finish_reason = self.tools.finish_reason(finish_reason)
            return self._delta_chunk({"content": held} if held else {}, finish_reason)
        if self.chat:
            delta: dict = {"content": text} if text or finish_reason is None else {}
            if self.first:
                delta["role"] = "assistant"
                self.first = False
            choice = {
                "index": 0,
                "delta": delta,
                "finish_reason": finish_reason,
                "logprobs": self.logprobs(logprobs),
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "finish_reason": finish_reason,
                "logprobs": self.logprobs(logprobs),
            }
        return self._base([choice])

    def _delta_chunk(self, delta: dict, finish_reason: str | None = None) -> dict:
        if self.first:
            delta = {"role": "assistant", **delta}
            self.first = False
        choice = {
            "index": 0,
            "delta": delta,
            "finish_reason": finish_reason,
            "logprobs": None,
        }
        return self._base([choice])

    def token_chunks(self, text: str, logprobs: list[dict] | None = None) -> list[dict]:
        """The streamed chunks of the next piece of the answer, ``text``: one,
        or for a request with tools those of the content and tool-call deltas
        it completes (``jobs.toolcalls.answers``; none while a call's name is
        being written)."""
        if self.tools is None:
            return [self.chunk(text, logprobs=logprobs)]
        return [self._delta_chunk(delta) for delta in self.tools.deltas(text)]

    def token_sse(self, text: str, logprobs: list[dict] | None = None) -> bytes:
        """The server-sent events of the chunks carrying ``text`` (may be
        empty)."""
        return b"".join(sse(chunk) for chunk in self.token_chunks(text, logprobs))

    def usage_chunk(self, usage: dict) -> dict:
        """The final usage chunk of ``stream_options.include_usage``."""
        return {**self._base([]), "usage": usage}

    def whole(
        self,
        text: str,
        finish_reason: str,
        usage: dict,
        logprobs: list[dict] | None = None,
    ) -> dict:
        """A non-streamed response object (``logprobs``: every token's)."""
        if self.chat:
            message = {"role": "assistant", "content": text, "refusal": None}
            if self.tool_format:
                tools = ToolAnswer(self.tool_format)
                tools.deltas(text)
                tools.end()
                message = tools.message()
                finish_reason = tools.finish_reason(finish_reason)
            choice = {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason,
                "logprobs": self.logprobs(logprobs),
            }
            kind = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "finish_reason": finish_reason,
                "logprobs": self.logprobs(logprobs),
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
