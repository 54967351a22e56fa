"""A host's text as OpenAI's function-calling answers: streamed deltas
(``delta.content`` and ``delta.tool_calls``) as the text arrives, and a whole
``message`` with ``tool_calls``; ``finish_reason`` ``tool_calls`` when the
model called (docs/tools.md).

One ``ToolAnswer`` per job, fed every piece of the delivered text in order,
across a failover too: a continuation's text goes on where the first host's
stopped, so the deltas go on with no piece repeated or lost.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from functools import partial

from . import generic
from .native import LAYOUTS
from .sequence import SequenceParser

PARSERS: dict[str, Callable] = {
    generic.NAME: generic.CallParser,
    **{name: partial(SequenceParser, layout) for name, layout in LAYOUTS.items()},
}
"""A new parser of each tool-call format a job's ``params.tool_format`` names."""


def call_id() -> str:
    """A new call's id, ``call_`` and 24 hex digits."""
    return f"call_{secrets.token_hex(12)}"


class ToolAnswer:
    """Feeds a format's parser (``format``: a key of ``PARSERS``) and keeps
    the calls' ids."""

    def __init__(self, format: str) -> None:
        self.parser = PARSERS[format]()
        self.ids: dict[int, str] = {}  # call index -> id
        self.content: list[str] = []

    def deltas(self, text: str) -> list[dict]:
        """The chat ``delta`` objects ``text`` (the next piece) completes, in
        order: ``{"content": ...}`` or ``{"tool_calls": [{"index", "id",
        "type", "function": {"name", "arguments": ""}}]}`` (a call's first
        piece) or ``{"tool_calls": [{"index", "function": {"arguments"}}]}``;
        ``[]`` when the piece completes nothing yet (a name being written)."""
        return self._deltas(self.parser.feed(text))

    def end(self) -> list[dict]:
        """The ``delta`` objects the answer's end completes: text a parser
        held back (it might have begun a call), as content."""
        return self._deltas(self.parser.end())

    def _deltas(self, events: list[tuple]) -> list[dict]:
        out = []
        for event in events:
            if event[0] == "content":
                self.content.append(event[1])
                out.append({"content": event[1]})
            elif event[0] == "call":
                index = event[1]
                self.ids[index] = call_id()
                piece = {
                    "index": index,
                    "id": self.ids[index],
                    "type": "function",
                    "function": {"name": event[2], "arguments": ""},
                }
                out.append({"tool_calls": [piece]})
            else:
                out.append(
                    {
                        "tool_calls": [
                            {"index": event[1], "function": {"arguments": event[2]}}
                        ]
                    }
                )
        return out

    @property
    def called(self) -> bool:
        return bool(self.ids)

    def finish_reason(self, reason: str) -> str:
        """``tool_calls`` for an answer that called and ended by itself, its
        document whole (a ``stop`` sequence that cut it keeps ``stop``)."""
        if reason == "stop" and self.called and self.parser.complete:
            return "tool_calls"
        return reason

    def message(self) -> dict:
        """The whole answer's ``message`` (after every piece was fed)."""
        calls = [
            {
                "id": self.ids[i],
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for i, call in enumerate(self.parser.calls)
            if i in self.ids
        ]
        content = "".join(self.content)
        message: dict = {
            "role": "assistant",
            "content": content if content or not calls else None,
            "refusal": None,
        }
        if calls:
            message["tool_calls"] = calls
        return message
