"""The parser of a model's own tool-call format (``native.Layout``): an
answer is either text, or calls written one after another, each
``prefix`` + a JSON object ``{"name": ..., <arguments key>: {...}}`` +
``suffix``, joined by ``separator`` (Hermes and Qwen 2.5:
``<tool_call>\\n{...}\\n</tool_call>``; Llama 3.1: the bare object).

An answer is calls when it begins with the layout's ``lead`` (its prefix,
or ``{`` when it has none): text that may still become the lead is held
back until it does or cannot (``end`` gives it back as content; a literal
cut short after a call is dropped).
"""

from __future__ import annotations

from .calls import CallEvents
from .native import Layout
from .scanner import JsonScanner, Path, ScanError

_WS = " \t\n\r"


class SequenceParser(CallEvents):
    """The answer's text, piece by piece (``feed``), as ``CallEvents``'
    events; ``end()`` when the answer is over.

    Text outside the format (text that
    begins otherwise than the lead, or a host that left the constraint) goes
    on as content from the character where it leaves it: nothing is dropped.
    """

    def __init__(self, layout: Layout) -> None:
        super().__init__()
        self.layout = layout
        self.lead = layout.prefix or "{"
        self.verbatim = False  # the rest is content
        self._state = "lead"  # lead, document, suffix, between, over
        self._held = ""  # literal text matched so far, not yet given
        self._index = -1  # the call being written
        self._scanner: JsonScanner | None = None
        self._opened = False  # the call's JSON object has begun

    @property
    def complete(self) -> bool:
        """The answer is whole calls of the format (not cut short)."""
        return (
            not self.verbatim and self._state in ("between", "over") and not self._held
        )

    def feed(self, text: str) -> list[tuple]:
        """The events ``text`` (the next piece of the answer) completes."""
        for i, char in enumerate(text):
            if self.verbatim:
                self._content(text[i:])
                break
            try:
                self._char(char)
            except ScanError:
                self.verbatim = True
                self._content(self._held + text[i:])
                self._held = ""
                break
        return self._merged()

    def end(self) -> list[tuple]:
        """The events the answer's end completes: text held back before any
        call (it may have been the answer's text), as content; held after a
        call, it was the format's own literal cut short (a suffix, the next
        call's prefix: ``max_tokens`` or a ``stop`` ended it there), which is
        no content, as OpenAI's calls carry none."""
        if self._state == "lead":
            self._content(self._held)
        self._held = ""
        return self._merged()

    def _char(self, char: str) -> None:
        layout = self.layout
        if self._state == "document":
            if not self._opened:
                if char in _WS:
                    return
                if char != "{":
                    raise ScanError(f"a call is a JSON object, not {char!r}…")
                self._opened = True
            self._scanner.feed(char)  # type: ignore[union-attr]
            if self._scanner.done:  # type: ignore[union-attr]
                if not self._call(self._index).complete:
                    raise ScanError("a call without a function's name")
                self._state = "suffix" if layout.suffix else self._after_call()
        elif self._state in ("lead", "between"):
            expected = (
                self.lead if self._state == "lead" else layout.separator + layout.prefix
            )
            self._literal(char, expected)
        elif self._state == "suffix":
            if not self._held and char in _WS and not layout.suffix.startswith(char):
                return  # the JSON's trailing space
            self._literal(char, layout.suffix)
        elif char not in _WS:  # over: only the JSON's trailing space
            raise ScanError(f"text after the last call: {char!r}")

    def _literal(self, char: str, expected: str) -> None:
        """Match ``char`` against the literal ``expected`` (held until whole);
        ScanError when it cannot be (its text is then content)."""
        held = self._held + char
        if not expected.startswith(held):
            if self._state == "lead":
                self._held = ""
                self.verbatim = True
                self._content(held)
                return
            raise ScanError(f"expected {expected!r}, got {held!r}")
        self._held = held
        if held != expected:
            return
        self._held = ""
        if self._state == "suffix":
            self._state = self._after_call()
        else:
            self._document(
                held[len(self.layout.separator) :] if self._state == "between" else held
            )

    def _after_call(self) -> str:
        return "between" if self.layout.parallel else "over"

    def _document(self, matched: str) -> None:
        """A call begins; ``matched``: the lead as written (its JSON part, the
        ``{`` of a layout without prefix, goes to the new scanner)."""
        self._index += 1
        self._state = "document"
        self._scanner = JsonScanner(
            on_string=self._string,
            raw_wanted=self._is_arguments,
            on_raw=self._raw,
            on_value_end=self._value_end,
        )
        rest = matched[len(self.layout.prefix) :]  # "{" or ""
        self._opened = bool(rest)
        if rest:
            self._scanner.feed(rest)

    def _is_arguments(self, path: Path) -> bool:
        return path == (self.layout.arguments,)

    def _string(self, path: Path, text: str) -> None:
        if path == ("name",):
            self._name(self._index, text)

    def _raw(self, path: Path, text: str) -> None:
        self._arguments(self._index, text)

    def _value_end(self, path: Path) -> None:
        if path == ("name",):
            self._name_end(self._index)
