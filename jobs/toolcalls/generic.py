"""The generic JSON tool-call format: for a model whose chat template has no
tool-call format of its own (SmolLM2's), the answer is one JSON object,

- ``{"tool_calls": [{"name": <function>, "arguments": {...}}, ...]}`` to call
  functions, or
- ``{"content": "<text>"}`` to answer in prose (``tool_choice: "auto"`` only),

described to the model in a system preamble (``preamble``) and held to by
constrained decoding (``constraint``: a JSON schema sent to the host as a
``json_schema`` response format). ``CallParser`` turns the host's text into
content and calls as the text arrives (docs/tools.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .calls import CallEvents, call_schema, defs_hoisted
from .scanner import JsonScanner, Path, ScanError

NAME = "generic_json"


@dataclass(frozen=True)
class Function:
    """One function of ``tools``: its name, description and parameters (a
    JSON schema within ``jobs.schemas``' subset, annotations dropped)."""

    name: str
    description: str
    parameters: dict
    shown_parameters: dict  # as the renter wrote it (annotations kept): the preamble's


@dataclass(frozen=True)
class Choice:
    """What the answer may be: ``mode`` ``auto`` (prose or calls),
    ``required`` (calls) or ``named`` (calls of ``name`` alone); ``parallel``:
    more than one call allowed."""

    mode: str
    parallel: bool = True
    name: str | None = None


def constraint(functions: list[Function], choice: Choice) -> dict:
    """The JSON schema every answer matches (``jobs.schemas`` subset). Each
    function's ``$defs`` move to the root under ``f<index>_<name>`` (their
    ``$ref`` rewritten), since a ``$ref`` points from the root."""
    defs: dict[str, Any] = {}
    members = []
    for i, function in enumerate(functions):
        if choice.mode == "named" and function.name != choice.name:
            continue
        parameters = defs_hoisted(function.parameters, f"f{i}_", defs)
        members.append(call_schema(function.name, parameters, "arguments"))
    calls: dict[str, Any] = {
        "type": "array",
        "items": members[0] if len(members) == 1 else {"anyOf": members},
        "minItems": 1,
    }
    if not choice.parallel or choice.mode == "named":
        calls["maxItems"] = 1
    called = {
        "type": "object",
        "properties": {"tool_calls": calls},
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    if choice.mode == "auto":
        prose = {
            "type": "object",
            "properties": {"content": {"type": "string"}},
            "required": ["content"],
            "additionalProperties": False,
        }
        schema: dict[str, Any] = {"anyOf": [prose, called]}
    else:
        schema = called
    if defs:
        schema["$defs"] = defs
    return schema


def preamble(functions: list[Function], choice: Choice) -> str:
    """The system text telling the model its functions and the format."""
    listed = [
        {
            "name": f.name,
            "description": f.description,
            "parameters": _untitled(f.shown_parameters, f.description),
        }
        for f in functions
    ]
    call = '{"tool_calls": [{"name": <function name>, "arguments": <JSON object>}]}'
    if choice.mode == "named":
        how = (
            f"Call the function {choice.name}: answer with one JSON object "
            f'{{"tool_calls": [{{"name": "{choice.name}", "arguments": <JSON object>}}]}}.'
        )
    elif choice.mode == "required":
        how = f"Call at least one function: answer with one JSON object {call}."
    else:
        how = (
            f"To call functions, answer with one JSON object {call}; to answer "
            'in text, answer with one JSON object {"content": <your answer>}.'
        )
    if not choice.parallel or choice.mode == "named":
        how += " Make one call at a time."
    return (
        "You can call these functions (their parameters are JSON Schema):\n"
        + json.dumps(listed, ensure_ascii=False)
        + "\n"
        + how
        + ' A function\'s result comes back as a message {"tool_result": ...}.'
    )


def _untitled(schema: Any, description: str) -> Any:
    """``schema`` as the preamble shows it: without ``title`` (pydantic's
    names of each property, which the model does not need) and without a
    top-level ``description`` repeating the function's: a shorter prompt."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: strip(v)
                for k, v in node.items()
                if not (k == "title" and isinstance(v, str))
            }
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    shown = strip(schema)
    if isinstance(shown, dict) and shown.get("description") == description:
        del shown["description"]
    return shown


def calls_text(calls: list[dict], content: str | None) -> str:
    """An assistant's earlier calls as this format writes them (``calls``:
    ``{"name", "arguments"}`` with ``arguments`` JSON text, kept as text when
    it does not parse), with its ``content`` beside them when it had some."""
    out: dict[str, Any] = {}
    if content:
        out["content"] = content
    rendered = []
    for call in calls:
        try:
            arguments = json.loads(call["arguments"])
        except ValueError:
            arguments = call["arguments"]
        rendered.append({"name": call["name"], "arguments": arguments})
    out["tool_calls"] = rendered
    return json.dumps(out, ensure_ascii=False)


def result_text(*, name: str | None, tool_call_id: str | None, content: str) -> str:
    """A ``tool`` message's result as this format writes it (a user turn)."""
    result: dict[str, Any] = {}
    if name:
        result["name"] = name
    if tool_call_id:
        result["tool_call_id"] = tool_call_id
    result["content"] = content
    return json.dumps({"tool_result": result}, ensure_ascii=False)


class CallParser(CallEvents):
    """The answer's text, piece by piece (``feed``), as ``CallEvents``'
    events in order.

    Text that is not this format (a host that ignored the constraint) from
    the character where it stops being so goes on as ``content``, so nothing
    a host delivered is dropped.
    """

    def __init__(self) -> None:
        super().__init__()
        self.verbatim = False  # the text left the format: the rest is content
        self._scanner = JsonScanner(
            on_string=self._string,
            raw_wanted=self._is_arguments,
            on_raw=self._raw,
            on_value_end=self._value_end,
        )

    @property
    def complete(self) -> bool:
        """The answer is one whole document of the format (not cut short)."""
        return not self.verbatim and self._scanner.done

    def feed(self, text: str) -> list[tuple]:
        """The events ``text`` (the next piece of the answer) completes."""
        if self.verbatim:
            self._content(text)
        else:
            for i, char in enumerate(text):
                try:
                    self._scanner.feed(char)
                except ScanError:
                    self.verbatim = True
                    self._content(text[i:])
                    break
        return self._merged()

    def end(self) -> list[tuple]:
        """The events the answer's end completes: none (nothing is held)."""
        return []

    @staticmethod
    def _call_index(path: Path, key: str) -> int | None:
        if len(path) == 3 and path[0] == "tool_calls" and path[2] == key:
            return path[1] if isinstance(path[1], int) else None
        return None

    def _is_arguments(self, path: Path) -> bool:
        return self._call_index(path, "arguments") is not None

    def _string(self, path: Path, text: str) -> None:
        if path == ("content",):
            self._content(text)
        index = self._call_index(path, "name")
        if index is not None:
            self._name(index, text)

    def _raw(self, path: Path, text: str) -> None:
        self._arguments(self._call_index(path, "arguments"), text)  # type: ignore[arg-type]

    def _value_end(self, path: Path) -> None:
        index = self._call_index(path, "name")
        if index is not None:
            self._name_end(index)
