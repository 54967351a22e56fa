"""An incremental scanner of one JSON document arriving in pieces (a host's
text, token by token), reporting what a tool-call parser needs as soon as the
characters are there: the decoded characters of string values, and the raw
characters of chosen values, each with the path of the value.

No installed library does this: ``json`` and ``jiter`` parse whole (or
partial) documents into values, not the raw text span of a value still being
written, which is what OpenAI's streamed ``function.arguments`` are. The
scanner checks JSON's grammar as far as a parser needs it (nesting, string
escapes, separators); a finished document is checked again by ``json.loads``
where its value is needed (``jobs.toolcalls.generic``).

A path is a tuple of object keys (str) and array indexes (int) from the root.
"""

from __future__ import annotations

import json
from collections.abc import Callable

Path = tuple[str | int, ...]

_WS = " \t\n\r"
_ESCAPES = {
    '"': '"',
    "\\": "\\",
    "/": "/",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
}
_LITERAL = set("-+.0123456789eEtrufalsn")


class ScanError(ValueError):
    """The text is not JSON (raised at the first character that cannot be)."""


class _Frame:
    __slots__ = ("array", "key", "index", "expect")

    def __init__(self, array: bool) -> None:
        self.array = array
        self.key: str | None = None
        self.index = 0
        # obj: key_or_end, key, colon, value, comma_or_end; arr: value_or_end,
        # value, comma_or_end
        self.expect = "value_or_end" if array else "key_or_end"

    def position(self) -> str | int:
        return self.index if self.array else self.key  # type: ignore[return-value]


class JsonScanner:
    """Feed text with ``feed``; callbacks receive what each piece completes.

    - ``on_string(path, text)``: decoded characters of the string value at
      ``path`` (called as they arrive; ``on_value_end`` ends the string);
    - ``raw_wanted(path) -> bool``: asked when a value starts; when true, every
      character of that value (from its first to its last) goes to
      ``on_raw(path, text)`` as it arrives;
    - ``on_value_end(path)``: the value at ``path`` is complete.

    ``done`` is true once the top-level value is complete. Raises ScanError
    on text that is not JSON (the scanner is then unusable).
    """

    def __init__(
        self,
        *,
        on_string: Callable[[Path, str], None],
        raw_wanted: Callable[[Path], bool],
        on_raw: Callable[[Path, str], None],
        on_value_end: Callable[[Path], None],
    ) -> None:
        self._on_string, self._raw_wanted = on_string, raw_wanted
        self._on_raw, self._on_value_end = on_raw, on_value_end
        self._stack: list[_Frame] = []
        self.done = False
        self._mode = "ws"  # ws, string, literal
        self._string_is_key = False
        self._string_path: Path = ()
        self._key: list[str] = []
        self._escape: str | None = None  # the escape being read, from its "\"
        self._high: str | None = None  # a high surrogate's escape awaiting its low
        self._literal: list[str] = []
        self._raw_path: Path | None = None  # the value being captured raw
        self._raw_depth = 0
        self._raw: list[str] = []
        self._decoded: list[str] = []

    def feed(self, text: str) -> None:
        """Scan ``text``, the next characters of the document."""
        for char in text:
            self._char(char)
        self._flush()

    def _flush(self) -> None:
        if self._decoded:
            self._on_string(self._string_path, "".join(self._decoded))
            self._decoded = []
        if self._raw:
            self._on_raw(self._raw_path, "".join(self._raw))  # type: ignore[arg-type]
            self._raw = []

    def _path(self) -> Path:
        return tuple(frame.position() for frame in self._stack)

    def _char(self, char: str) -> None:
        if self._mode == "literal" and char not in _LITERAL:
            self._literal_end()  # the character after a literal is not its own
        if self._raw_path is not None:
            self._raw.append(char)
        if self._mode == "string":
            self._string_char(char)
            return
        if self._mode == "literal":
            self._literal.append(char)
            return
        if char in _WS:
            return
        if self.done:
            raise ScanError(f"text after the JSON value: {char!r}")
        frame = self._stack[-1] if self._stack else None
        expect = frame.expect if frame else "value"
        if expect in ("value", "value_or_end"):
            if char == "]" and expect == "value_or_end":
                self._close(char)
            else:
                self._value_start(char)
        elif expect in ("key_or_end", "key"):
            if char == "}" and expect == "key_or_end":
                self._close(char)
            elif char == '"':
                self._mode, self._string_is_key, self._key = "string", True, []
            else:
                raise ScanError(f"expected a key, got {char!r}")
        elif expect == "colon":
            if char != ":":
                raise ScanError(f"expected ':', got {char!r}")
            frame.expect = "value"  # type: ignore[union-attr]
        elif expect == "comma_or_end":
            if char == ",":
                if frame.array:  # type: ignore[union-attr]
                    frame.index += 1  # type: ignore[union-attr]
                    frame.expect = "value"  # type: ignore[union-attr]
                else:
                    frame.expect = "key"  # type: ignore[union-attr]
            elif char == ("]" if frame.array else "}"):  # type: ignore[union-attr]
                self._close(char)
            else:
                raise ScanError(f"expected ',' or a closing bracket, got {char!r}")

    def _value_start(self, char: str) -> None:
        path = self._path()
        if self._raw_path is None and self._raw_wanted(path):
            self._raw_path, self._raw_depth = path, len(self._stack)
            self._raw.append(char)
        if char in "{[":
            self._stack.append(_Frame(char == "["))
        elif char == '"':
            self._mode, self._string_is_key, self._string_path = "string", False, path
        elif char in _LITERAL:
            self._mode, self._literal = "literal", [char]
        else:
            raise ScanError(f"expected a JSON value, got {char!r}")

    def _close(self, char: str) -> None:
        self._stack.pop()
        self._value_end()

    def _value_end(self) -> None:
        """The value just scanned is complete: its parent expects a separator."""
        path = self._path()
        if self._stack:
            self._stack[-1].expect = "comma_or_end"
        else:
            self.done = True
        if self._raw_path is not None and len(self._stack) == self._raw_depth:
            self._flush()
            self._raw_path = None
        self._flush()
        self._on_value_end(path)

    def _literal_end(self) -> None:
        text = "".join(self._literal)
        try:
            json.loads(text)
        except ValueError:
            raise ScanError(f"not a JSON literal: {text!r}") from None
        self._mode = "ws"
        self._value_end()

    def _string_char(self, char: str) -> None:
        if self._escape is not None:
            self._escape += char
            if len(self._escape) == 2 and char != "u":
                if char not in _ESCAPES:
                    raise ScanError(f"bad escape {self._escape!r}")
                self._string_text(_ESCAPES[char])
                self._escape = None
            elif len(self._escape) == 6:
                self._unicode_escape(self._escape)
                self._escape = None
            return
        if char == "\\":
            self._escape = char
        elif char == '"':
            if self._high is not None:
                raise ScanError("a lone surrogate escape")
            self._mode = "ws"
            if self._string_is_key:
                frame = self._stack[-1]
                frame.key, frame.expect = "".join(self._key), "colon"
            else:
                self._value_end()
        elif char < " ":
            raise ScanError("a control character in a string")
        elif self._high is not None:
            raise ScanError("a lone surrogate escape")
        else:
            self._string_text(char)

    def _unicode_escape(self, escape: str) -> None:
        try:
            unit = int(escape[2:], 16)
        except ValueError:
            raise ScanError(f"bad escape {escape!r}") from None
        if self._high is not None:
            if not 0xDC00 <= unit <= 0xDFFF:
                raise ScanError("a lone surrogate escape")
            pair, self._high = self._high + escape, None
            self._string_text(json.loads(f'"{pair}"'))
        elif 0xD800 <= unit <= 0xDBFF:
            self._high = escape
        elif 0xDC00 <= unit <= 0xDFFF:
            raise ScanError("a lone surrogate escape")
        else:
            self._string_text(chr(unit))

    def _string_text(self, text: str) -> None:
        if self._string_is_key:
            self._key.append(text)
        else:
            self._decoded.append(text)
