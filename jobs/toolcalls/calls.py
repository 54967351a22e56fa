"""What every tool-call parser shares: the calls as parsed so far (``Call``)
and the events they give as the host's text arrives (``CallEvents``), so a
format's parser (``generic``, ``sequence``) only says where in its text a
call's name and arguments are; and the JSON schema of one call,
``{"name": <function>, <arguments key>: {...}}`` (``call_schema``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..schematext import DEFS, refs_moved
from .scanner import ScanError


@dataclass
class Call:
    """A call as parsed so far: ``name`` once complete, ``arguments`` the raw
    JSON text received so far."""

    name: str | None = None
    arguments: str = ""
    complete: bool = False


class CallEvents:
    """The events of a parser's ``feed``, in order: ``("content", text)``,
    ``("call", index, name)`` (a call's first piece: its name is complete),
    ``("arguments", index, text)`` (the next raw characters of its
    arguments, only after its ``call`` event). Subclasses report what their
    scanner finds through ``_content``, ``_name``, ``_arguments`` and
    ``_name_end`` (which raises ScanError for a name that is no function's:
    not a non-empty string)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._events: list[tuple] = []

    def _merged(self) -> list[tuple]:
        """The events since the last call, neighbours of a kind joined."""
        out: list[tuple] = []
        for event in self._events:
            if (
                out
                and out[-1][0] == event[0]
                and event[0] != "call"
                and out[-1][:-1] == event[:-1]
            ):
                out[-1] = (*event[:-1], out[-1][-1] + event[-1])
            else:
                out.append(event)
        self._events = []
        return out

    def _content(self, text: str) -> None:
        if text:
            self._events.append(("content", text))

    def _call(self, index: int) -> Call:
        while len(self.calls) <= index:
            self.calls.append(Call())
        return self.calls[index]

    def _name(self, index: int, text: str) -> None:
        call = self._call(index)
        call.name = (call.name or "") + text  # complete at its value's end

    def _arguments(self, index: int, text: str) -> None:
        call = self._call(index)
        call.arguments += text
        if call.complete:
            self._events.append(("arguments", index, text))

    def _name_end(self, index: int) -> None:
        call = self._call(index)
        if not call.name:
            raise ScanError("a call's name must be a function's name")
        call.complete = True
        self._events.append(("call", index, call.name or ""))
        if call.arguments:  # arguments written before the name
            self._events.append(("arguments", index, call.arguments))


def call_schema(name: str, parameters: dict, arguments_key: str) -> dict:
    """The JSON schema of one call of function ``name``: ``{"name": name,
    <arguments_key>: <arguments matching parameters>}``, in that order."""
    return {
        "type": "object",
        "properties": {"name": {"const": name}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def defs_hoisted(schema: dict, prefix: str, defs: dict) -> dict:
    """``schema`` (checked) without its ``$defs``/``definitions``, which go
    into ``defs`` renamed with ``prefix``; every ``$ref`` to them, or into
    them, rewritten (a ``$ref`` points from the root of the schema a call's
    is part of)."""
    moves = {
        f"#/{key}/{name}": f"#/$defs/{prefix}{name}"
        for key in DEFS
        for name in schema.get(key) or {}
    }
    for key in DEFS:
        for name, sub in (schema.get(key) or {}).items():
            defs[f"{prefix}{name}"] = refs_moved(sub, moves)
    return refs_moved({k: v for k, v in schema.items() if k not in DEFS}, moves)
