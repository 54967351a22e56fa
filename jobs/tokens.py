"""Counting a model's tokens with its own tokenizer, for every catalog model
whose data the catalog keeps (``catalog.ModelData``: the vocabulary and chat
template read from its GGUF file, ``catalog.modeldata.model_tokenizer``).

The rules are the same for every model (DESIGN.md "Money": the recount and
``min(reported, recount)``, the context refusal, a continuation's budget, prompt
token counts); what differs is the model's data. For a model without data no
tokenizer is known and callers fall back to the host's word, capped by the
number of characters (never more tokens than characters).
"""

from __future__ import annotations

import codecs
import functools

from catalog.modeldata import ModelTokenizer, model_tokenizer
from modeldata.template import ChatTemplateError, prompt_build

from .requests import ROLES


def token_count(model_id: str, text: str) -> int | None:
    """Number of tokens of ``text`` for ``model_id`` (no BOS, special tokens'
    text as plain text), or None without a tokenizer."""
    if not text:
        return 0
    tokenizer = model_tokenizer(model_id)
    if tokenizer is None:
        return None
    return len(tokenizer.vocab.tokenize(text, add_bos=False, special=False))


def prompt_token_count(
    model_id: str, messages: list[dict] | None, prompt: str | None
) -> int | None:
    """Tokens of the prompt a host feeds the model, or None without a tokenizer
    (or, for chat messages, without a template that renders them).

    Counted as the reference engine counts it (``agent.engines.llamacpp``): the
    chat rendered with the model's own template (its default system prompt
    included when the renter gives none), BOS added once.
    """
    tokenizer = model_tokenizer(model_id)
    if tokenizer is None:
        return None
    return _prompt_tokens(tokenizer, messages, prompt)


def _prompt_tokens(
    tokenizer: ModelTokenizer, messages: list[dict] | None, prompt: str | None
) -> int | None:
    if messages is not None:
        if tokenizer.template is None:
            return None
        try:
            text = prompt_build(tokenizer.template, messages, None, "")
        except ChatTemplateError:
            return None  # the host cannot render them either
    else:
        text = prompt or ""
    vocab = tokenizer.vocab
    tokens = vocab.tokenize(text, add_bos=True, special=True)
    if len(tokens) >= 2 and tokens[0] == tokens[1] == vocab.bos_id:
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
    tokenizer = model_tokenizer(model_id)
    base = None if tokenizer is None else _template_bytes(tokenizer)
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
    at once: rendering and tokenizing them takes seconds of the process's time.
    """
    tokenizer = model_tokenizer(model_id)
    if tokenizer is None:
        return None
    texts = (
        [prompt or ""]
        if messages is None
        else [str(m.get("content") or "") for m in messages]
    )
    framing = 0
    if messages is not None:
        if tokenizer.template is None:
            return None
        framing = len(messages) * _message_tokens_least(tokenizer)
    if not any(texts):
        return framing
    dropped = _characters_dropped(tokenizer)
    text_bytes = sum(
        len(text.encode("utf-8")) - sum(text.count(c) for c in dropped)
        for text in texts
    )
    return max(framing, -(-text_bytes // _token_bytes_most(tokenizer)))


@functools.lru_cache(maxsize=16)
def _characters_dropped(tokenizer: ModelTokenizer) -> tuple[str, ...]:
    """The ASCII characters the tokenizer drops (no token stands for them;
    SmolLM2: six control characters): their bytes are in no token, so
    ``prompt_tokens_least`` does not count them. (For SmolLM2 every other
    character of Unicode was checked to make at least one token; byte-level
    BPE and SentencePiece with byte tokens have a token for every byte.)"""
    vocab = tokenizer.vocab
    return tuple(
        chr(c)
        for c in range(128)
        if not vocab.tokenize(chr(c), add_bos=False, special=False)
    )


@functools.lru_cache(maxsize=16)
def _token_bytes_most(tokenizer: ModelTokenizer) -> int:
    """The most UTF-8 bytes one token of the model's vocabulary stands for
    (special tokens' text included): every tokenization of n bytes has at
    least n / this many tokens."""
    vocab = tokenizer.vocab
    return max(
        (len(vocab.token_bytes(t, special=True)) for t in range(len(vocab))),
        default=1,
    )


@functools.lru_cache(maxsize=16)
def _message_tokens_least(tokenizer: ModelTokenizer) -> int:
    """The fewest tokens one more message adds to a rendered chat: for each role,
    the count of (an empty user message, an empty message of that role) less
    that of the empty user message alone; the least of them, less one (a
    message's content may merge with its framing), at least 1. Roles the
    template refuses after a user message are left out; 0 when it renders
    none (the bound then rests on the text alone)."""
    one = _prompt_tokens(tokenizer, [{"role": "user", "content": ""}], None)
    if one is None:
        return 0
    added = []
    for role in sorted(ROLES):
        two = _prompt_tokens(
            tokenizer,
            [{"role": "user", "content": ""}, {"role": role, "content": ""}],
            None,
        )
        if two is not None:
            added.append(two - one)
    return max(1, min(added) - 1) if added else 0


@functools.lru_cache(maxsize=16)
def _template_bytes(tokenizer: ModelTokenizer) -> int | None:
    """UTF-8 bytes of the template rendering one empty user message; None
    without a template or when it refuses that."""
    if tokenizer.template is None:
        return None
    try:
        empty = prompt_build(
            tokenizer.template, [{"role": "user", "content": ""}], None, ""
        )
    except ChatTemplateError:
        return None
    return len(empty.encode("utf-8"))


CANONICAL_MAX_TEMPERATURE = 0.0
"""The hottest plain-text sampling whose honest counts stay within
``token_count_inflated``'s tolerance of the recount: greedy only. A sampled
answer's split is the model's draw (SmolLM2 at T 0.7 wrote an honest answer
in 48 tokens that re-tokenize into 44: bench/trust.py's bank), so its ids are
believed when they spell the text; greedy answers and every spot check (T 0)
hold counts to the recount."""


def canonical_split_expected(*, constrained: bool, temperature: float | None) -> bool:
    """Whether an honest host's tokens for a request are expected to be close to
    the tokenizer's own split of their text: plain text (no ``response_format``:
    a grammar makes the sampler pick splits a re-tokenization never makes) at
    a temperature up to ``CANONICAL_MAX_TEMPERATURE``, greedy (None is 1)."""
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
    has no vocabulary for the model. Ids that do not spell the text are a
    false count when they number more than the recount (fewer gain the host
    nothing: billing takes the smaller, and an honest agent's miscount of a
    held-back token is no cheat). Ids that do are the count (``reported`` is their number,
    ``hosts.protocol.parse_done``), and may hold more tokens than characters
    (a character the sampler drew byte by byte).

    Without ids, more tokens than characters are flagged. With the model's
    tokenizer's ``recount`` and a ``canonical`` split expected
    (``canonical_split_expected``), with ids or without, more than ``recount``
    by over ``max(2, 5 %)`` is flagged: a continuation cut mid-word can
    tokenize one or two tokens differently, and a sampled answer may hold a
    token split the tokenizer would not make, but an honest sampler does not
    draw plain text in pieces finer than that (a host claiming finer splits to
    inflate its count is caught). Where the split is not expected canonical
    (a grammar's, a sampler's above T 0), ids that spell the text are
    believed, and a count without ids is held to the characters only: billing
    takes the recount whatever was reported, so such a count gains nothing. A
    15 % inflation of an answer of 14 tokens or more is flagged. A count under
    the recount is the host's loss, not a cheat.
    """
    if spelled is False:  # a false count, unless it claims no more than the text
        return recount is None or reported > recount
    if spelled is None and reported > len(text):
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
    tokenizer = model_tokenizer(model_id)
    if tokenizer is None:
        return None
    pieces = _token_pieces(tokenizer)
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


HELD_MAX = 4
"""At most this many of a segment's last ids stand for no text it sent: an
unfinished character (up to 3 bytes, one token each) and a stop's token."""


def token_ids_held(
    model_id: str, *, ids: list[int], text: str, continue_from: str = ""
) -> int:
    """How many of the last of ``ids`` (which spell ``text``:
    ``token_ids_spell``) stand for no text the host sent: the bytes of a
    character the answer ended inside (held back by the agent's decoder, as
    a ``max_tokens`` cut leaves it), or a last token all of whose text was a
    stop's. Counted, they are no finer split of the text (``segment_tokens``
    leaves them out of the count it compares with the recount)."""
    held = 0
    while held < min(HELD_MAX, len(ids) - 1) and token_ids_spell(
        model_id, ids=ids[: len(ids) - held - 1], text=text, continue_from=continue_from
    ):
        held += 1
    return held


def _agent_decode(raw: bytes) -> str:
    """``raw`` as the agent turns generated bytes into the text it sends."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return decoder.decode(raw).replace("\x00", "")


@functools.lru_cache(maxsize=16)
def _token_pieces(tokenizer: ModelTokenizer) -> list[bytes]:
    """The bytes each token id of the model stands for (``b""`` for a control
    token), as ``llama_token_to_piece(special=False)``."""
    vocab = tokenizer.vocab
    return [vocab.token_bytes(t, special=False) for t in range(len(vocab))]


def token_pieces(model_id: str) -> list[bytes] | None:
    """The bytes each token id of ``model_id`` stands for (``b""`` for a
    control token), or None without its vocabulary (``trust.verification.
    exemptions`` decodes a host's ``done.token_ids`` with them)."""
    tokenizer = model_tokenizer(model_id)
    return None if tokenizer is None else _token_pieces(tokenizer)
