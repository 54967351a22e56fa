"""What the in-process llama.cpp engine adds to plain decoding: a
``response_format`` served by a grammar, and each token's log-probabilities.

- ``GrammarMask``: a llama.cpp grammar (GBNF, from the JSON schema) as a logits
  processor, advanced token by token. A continuation first advances it over
  the text already delivered (``advance``), so what it generates is a valid
  suffix: prefix and suffix together match the schema.
- ``LogprobCapture``: keeps each step's raw logits (the model's own
  distribution, before temperature, top-p and any grammar) and turns the
  chosen token and its likeliest alternatives into OpenAI's entries.
- ``EntryQueue``: hands each token's entry out with the text that completes it
  (text may be held back for a stop sequence, or a character split over
  tokens).
"""

from __future__ import annotations

import ctypes
import json
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agent.engines.base import GenerationError, GenerationRequest, Piece

TOKEN_DATA = np.dtype(
    [("id", np.intc), ("logit", np.single), ("p", np.single)], align=True
)
"""llama.cpp's ``llama_token_data`` as a numpy record."""

GRAMMAR_TOP = 64
"""Candidates the grammar checks first each step (the likeliest): when one of
them is allowed, only the allowed ones among them stay (sampling keeps at most
40, and min-p drops the unlikely); when none is, the whole vocabulary is
checked. About 1 ms a token instead of ~8 ms for SmolLM2's 49,152 tokens, the
same choice at temperature 0."""

JSON_CHAR = r'[^"\\]'
"""llama-cpp-python's converter's unescaped string character (rule ``char``):
it lets control characters through raw, which JSON forbids in a string (an
answer with a raw newline in a value did not parse; its arguments reached
the renter cut). ``json_strict`` narrows it to ``JSON_CHAR_STRICT``, as
llama.cpp's own ``json.gbnf`` writes it."""
JSON_CHAR_STRICT = r'[^"\\\x7F\x00-\x1F]'

LOGPROB_FLOOR = -9999.0
"""The log-probability reported for a token the model gives no chance (-inf
is not JSON), as OpenAI reports it."""


def grammar_of(response_format: dict[str, Any]) -> str:
    """The GBNF grammar of a ``response_format`` (``json_object``: any JSON
    object; ``json_schema``: its schema; ``json_sequence``: its documents,
    ``sequence_grammar``), by llama-cpp-python's converter. Raises
    GenerationError when the converter cannot take the schema (the
    coordinator admits only the subset it can: docs/protocol-notes.md)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    kind = response_format.get("type")
    try:
        if kind == "json_sequence":
            return sequence_grammar(response_format["json_sequence"])
        schema: Any = (
            {"type": "object"}
            if kind == "json_object"
            else response_format["json_schema"]["schema"]
        )
        return json_strict(json_schema_to_gbnf(json.dumps(schema)))
    except Exception as exc:
        raise GenerationError(
            f"response_format: the schema has no grammar: {type(exc).__name__}: {exc}"
        ) from exc


def sequence_grammar(spec: dict[str, Any]) -> str:
    """The GBNF grammar of a ``json_sequence`` (docs/protocol-notes.md,
    2026-12-07): ``min_items`` to ``max_items`` documents, each ``prefix``,
    JSON text matching ``schema``, ``suffix``, joined by ``separator``; with
    ``text_unless``, any text that does not begin with it instead. The
    documents' rules are llama-cpp-python's converter's (``document``);
    only the literals around them are added here."""
    from llama_cpp.llama_grammar import DOTALL, SchemaConverter, _build_repetition

    converter = SchemaConverter(
        prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
    )
    schema = converter.resolve_refs(spec["schema"], "stdin")
    document = converter.visit(schema, "document")
    literal = converter._format_literal
    prefix, suffix = spec.get("prefix") or "", spec.get("suffix") or ""
    parts = [
        literal(prefix) if prefix else "",
        document,
        literal(suffix) if suffix else "",
    ]
    item = converter._add_rule("document-item", " ".join(p for p in parts if p))
    separator = spec.get("separator") or ""
    calls = _build_repetition(
        item,
        spec.get("min_items", 1),
        spec.get("max_items"),
        separator_rule=literal(separator) if separator else None,
    )
    unless = spec.get("text_unless")
    if unless:
        converter._add_rule("text-any", f"{DOTALL}*")
        calls = f"({calls}) | ({_not_starting(unless, literal)})?"
    converter._add_rule("root", calls)
    return json_strict(converter.format_grammar())


def json_strict(grammar: str) -> str:
    """``grammar`` (the converter's GBNF) with its string characters held to
    JSON's: no raw control character (``JSON_CHAR``). Raises GenerationError
    when a string rule is there but not as expected (another converter)."""
    lines = grammar.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("char ::= "):
            if not line.startswith(f"char ::= {JSON_CHAR} |"):
                raise GenerationError(f"unexpected string rule from the converter: {line}")
            lines[i] = line.replace(JSON_CHAR, JSON_CHAR_STRICT, 1)
    return "\n".join(lines) + ("\n" if grammar.endswith("\n") else "")


def _not_starting(text: str, literal: Callable[[str], str]) -> str:
    """GBNF of the non-empty texts that do not begin with ``text``: a proper
    prefix of it, or its first characters up to one that differs and then
    anything (rule ``text-any``)."""
    head, rest = text[0], text[1:]
    other = f"[^\\U{ord(head):08X}] text-any"
    if not rest:
        return other
    return f"{other} | {literal(head)} ({_not_starting(rest, literal)})?"


class GrammarMask:
    """A grammar over llama.cpp tokens: a logits processor forbidding what it
    does not allow next (logit -inf), and its state, advanced by ``accept``.

    ``close()`` frees it. Raises GenerationError when llama.cpp refuses the
    grammar text.
    """

    def __init__(
        self, vocab: Any, grammar: str, n_vocab: int, *, sampler: Any = None
    ) -> None:
        """``sampler``: a llama.cpp grammar sampler to own (``copy``)."""
        import llama_cpp

        self._llama_cpp = llama_cpp
        self._vocab, self._n_vocab = vocab, n_vocab
        self._sampler = sampler or llama_cpp.llama_sampler_init_grammar(
            vocab, grammar.encode("utf-8"), b"root"
        )
        if not self._sampler:
            raise GenerationError("response_format: llama.cpp refused its grammar")
        self._full = np.zeros(n_vocab, dtype=TOKEN_DATA)
        self._full["id"] = np.arange(n_vocab)
        self._top = np.zeros(min(GRAMMAR_TOP, n_vocab), dtype=TOKEN_DATA)
        self._one = np.zeros(1, dtype=TOKEN_DATA)

    def _apply(self, candidates: Any) -> None:
        """Set the logit of every candidate the grammar forbids now to -inf."""
        llama_cpp = self._llama_cpp
        array = llama_cpp.llama_token_data_array(
            data=candidates.ctypes.data_as(llama_cpp.llama_token_data_p),
            size=len(candidates),
            selected=-1,
            sorted=False,
        )
        llama_cpp.llama_sampler_apply(self._sampler, ctypes.byref(array))

    def __call__(self, _input_ids: Any, scores: Any) -> Any:
        """Logits processor: the likeliest allowed tokens keep their logits."""
        top = self._top
        if len(top):
            ids = np.argpartition(scores, -len(top))[-len(top) :]
            top["id"] = ids
            top["logit"] = scores[ids]
            self._apply(top)
            allowed = np.isfinite(top["logit"])
            if allowed.any():
                out = np.full_like(scores, -np.inf)
                out[ids[allowed]] = scores[ids[allowed]]
                return out
        full = self._full[: len(scores)]
        full["logit"] = scores
        self._apply(full)
        return full["logit"].copy()

    def allows(self, token: int) -> bool:
        """Whether the grammar allows ``token`` next."""
        one = self._one
        one["id"] = token
        one["logit"] = 0.0
        self._apply(one)
        return bool(np.isfinite(one["logit"][0]))

    def accept(self, token: int) -> None:
        """Advance past ``token`` (never an end-of-generation token). Raises
        GenerationError when the grammar does not allow it (llama.cpp would
        abort the process on such a token)."""
        if not self.allows(token):
            raise GenerationError(
                "response_format: the text does not match the schema here"
            )
        self._llama_cpp.llama_sampler_accept(self._sampler, token)

    def advance(self, tokens: Sequence[int]) -> None:
        """Advance over ``tokens`` (a continuation's delivered text, tokenized
        on its own: the grammar reads their text, whatever the split). Raises
        GenerationError when that text is no prefix the schema allows."""
        for token in tokens:
            try:
                self.accept(token)
            except GenerationError:
                raise GenerationError(
                    "response_format: continue_from is not the start of an "
                    "answer this schema allows"
                ) from None

    def copy(self) -> GrammarMask:
        """An independent grammar in the same state."""
        clone = self._llama_cpp.llama_sampler_clone(self._sampler)
        return GrammarMask(self._vocab, "", self._n_vocab, sampler=clone)

    def close(self) -> None:
        if self._sampler:
            self._llama_cpp.llama_sampler_free(self._sampler)
            self._sampler = None


class LogprobCapture:
    """A logits processor that changes nothing and keeps the step's logits,
    for ``entry``. Put it first, so it sees the model's raw logits."""

    def __init__(self, top: int, text_of: Callable[[int], bytes]) -> None:
        """``top``: alternatives per token (0–20); ``text_of``: a token's bytes
        (its text for special tokens)."""
        self.top = top
        self._text_of = text_of
        self._scores: Any = None

    def __call__(self, _input_ids: Any, scores: Any) -> Any:
        self._scores = np.array(scores, dtype=np.float64)
        return scores

    def entry(self, token: int, sent: bytes) -> dict[str, Any]:
        """The entry of ``token`` just sampled: ``sent`` is what of its bytes
        the answer gained (less than all after token healing)."""
        scores = self._scores  # raw logits: finite (no mask has run yet)
        peak = scores.max()
        total = peak + np.log(np.exp(scores - peak).sum())
        entry = self._item(sent, scores[token] - total)
        alternatives = []
        if self.top:
            ids = np.argpartition(scores, -self.top)[-self.top :]
            ids = ids[np.argsort(-scores[ids], kind="stable")]
            for alt in ids:
                alternatives.append(
                    self._item(self._text_of(int(alt)), scores[alt] - total)
                )
        entry["top_logprobs"] = alternatives
        return entry

    @staticmethod
    def _item(raw: bytes, logprob: float) -> dict[str, Any]:
        value = float(logprob) if np.isfinite(logprob) else LOGPROB_FLOOR
        return {
            "token": raw.decode("utf-8", errors="replace").replace("\x00", ""),
            "logprob": round(min(0.0, max(LOGPROB_FLOOR, value)), 6),
            "bytes": list(raw),
        }


class EntryQueue:
    """Tokens' entries waiting for the text that completes them.

    ``add`` each generated token's entry as it comes; ``take`` with each text
    emitted returns the entries whose bytes that text completes. With
    ``final`` (the answer's last text), a token only partly sent (cut by a stop
    sequence) is given with the bytes sent, and the rest is dropped: tokens
    whose text was never sent have no entry.
    """

    def __init__(self) -> None:
        self._waiting: deque[dict[str, Any]] = deque()
        self._credit = 0  # bytes emitted beyond the entries handed out

    def add(self, entry: dict[str, Any]) -> None:
        self._waiting.append(entry)

    def take(self, text: str, *, final: bool = False) -> list[dict[str, Any]]:
        self._credit += len(text.encode("utf-8"))
        out = []
        while self._waiting and len(self._waiting[0]["bytes"]) <= self._credit:
            entry = self._waiting.popleft()
            self._credit -= len(entry["bytes"])
            out.append(entry)
        if final:
            if self._waiting and self._credit > 0:
                entry = self._waiting[0]
                raw = bytes(entry["bytes"][: self._credit])
                out.append(
                    {
                        **entry,
                        "token": raw.decode("utf-8", errors="replace"),
                        "bytes": list(raw),
                    }
                )
            self._waiting.clear()
            self._credit = 0
        return out


class OutputExtras:
    """What one generation adds to plain text: its grammar (a
    ``response_format``) and its tokens' log-probabilities, either or both
    absent until ``prepare``. ``close()`` frees the grammar."""

    def __init__(self, *, token_bytes: Callable[[int], bytes]) -> None:
        """``token_bytes``: a token's bytes (a special token's text)."""
        self.token_bytes = token_bytes
        self.capture: LogprobCapture | None = None
        self.grammar: GrammarMask | None = None
        self.entries: EntryQueue | None = None

    def prepare(
        self, request: GenerationRequest, *, llama: Any, vocab: Any, heal: bytes
    ) -> None:
        """Set up what ``request`` asks: the capture of its ``logprobs``; the
        grammar of its ``response_format``, advanced over ``continue_from`` up
        to the bytes token healing re-generates (``heal``: those are sampled
        under it). Raises GenerationError (a schema without grammar, a
        ``continue_from`` the schema does not allow)."""
        if request.logprobs is not None:
            self.capture = LogprobCapture(request.logprobs, self.token_bytes)
            self.entries = EntryQueue()
        if not request.response_format:
            return
        self.grammar = GrammarMask(
            vocab, grammar_of(request.response_format), llama.n_vocab()
        )
        done = request.continue_from.encode("utf-8")
        done = done[: len(done) - len(heal)]
        if done:
            self.grammar.advance(llama.tokenize(done, add_bos=False, special=False))
        if heal:  # the healed bytes must be allowed too: checked on a copy
            probe = self.grammar.copy()
            try:
                probe.advance(llama.tokenize(heal, add_bos=False, special=False))
            finally:
                probe.close()

    def processors(self, healer: Any | None) -> list[Any]:
        """The logits processors, in order: the capture first (raw logits),
        then ``healer`` (token healing, when healing) and the grammar."""
        chain = [p for p in (self.capture, healer, self.grammar) if p is not None]
        return chain

    def token(self, token: int, sent: bytes) -> None:
        """``token`` was sampled (not an end-of-generation one) and ``sent``
        of its bytes are new text: the grammar advances, its entry waits."""
        if self.grammar is not None:
            self.grammar.accept(token)
        if sent and self.capture is not None and self.entries is not None:
            self.entries.add(self.capture.entry(token, sent))

    def piece(self, text: str, *, final: bool = False) -> str:
        """``text`` as the engine yields it: a ``Piece`` with the entries it
        completes when log-probabilities were asked (``EntryQueue.take``)."""
        if self.entries is None:
            return text
        return Piece(text, self.entries.take(text, final=final))

    def close(self) -> None:
        if self.grammar is not None:
            self.grammar.close()
