"""What of an answer a verifier can score, judged by what the coordinator
checks itself (DESIGN.md "Verifying real answers": which answers are verified
never rests on the host's own word; docs/trust.md "Exemptions").

A verifier scores the answer's text, tokenized again. Two things make that text
differ from the tokens the model drew, and both are seen here in the host's
own token ids (``done.token_ids``, already found to spell the delivered text
by ``jobs.tokens.token_ids_spell``), decoded with the model's vocabulary:

- a **stop cut**: the renter's ``stop`` sequence began inside the last
  counted token, so the text delivered ends inside it. Seen when the ids'
  text runs on past the delivered text, and what runs on is where one of the
  request's ``stop`` strings begins (it starts with one, or is the start of
  one the agent held back). The last token is then left out of what is
  verified: the text of the whole tokens before it is what the model drew.
- a **cut character**: bytes the model drew that are no UTF-8 (a character
  started and never finished), which the agent's decoder replaced by U+FFFD.
  Seen when an invalid byte sequence of the ids' bytes ends at a token
  boundary. Those U+FFFD are left out of the verified text (the rest of the
  answer is scored around them).

Anything else is verified as delivered: a U+FFFD the ids spell as its own
bytes, or any U+FFFD of a host that sent no ids, is text the host wrote; a
``finish_reason`` ``stop`` says nothing by itself. The ``exemption`` recorded
says what was left out (``rate.exempt_multiplier`` verifies a device more
whose share of such answers is unusual).
"""

from __future__ import annotations

import codecs
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from jobs.models import Attempt
from jobs.tokens import token_pieces

STOP_CUT = Attempt.Exemption.STOP_CUT.value
CUT_CHARACTER = Attempt.Exemption.CUT_CHARACTER.value

_CUT = "\udfff"  # a lone surrogate: no UTF-8 decoding yields one from valid bytes
_cut_ends = threading.local()


def _cut_mark(exc: UnicodeError) -> tuple[str, int]:
    """Decode an invalid byte sequence as the agent does (one replacement per
    maximal invalid sequence), as ``_CUT``, recording where it ended."""
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    _cut_ends.ends.append(exc.end)
    return _CUT, exc.end


codecs.register_error("ballast.cut", _cut_mark)


@dataclass(frozen=True)
class VerifiedText:
    """``text``: what a verifier scores of an answer (may be "": nothing to
    verify); ``exemption``: "" (all of it), ``STOP_CUT`` or ``CUT_CHARACTER``
    (what was left out, the latter when both were); ``token_ids``: the host's
    ids a verifier scores instead of ``text`` tokenized again (the tokens the
    model drew: a stop cut's last one left out, a cut character's kept, as
    they are what was sampled), None when the ids are not known to spell it."""

    text: str
    exemption: str
    token_ids: list[int] | None = None


def verified_text(
    *,
    model_id: str,
    text: str,
    token_ids: Sequence[int] | None,
    stop: Sequence[str] | str | None,
) -> VerifiedText:
    """What a verifier scores of ``text``, the answer a fresh attempt
    delivered, by the host's ``token_ids`` (None: it sent none) and the
    request's ``stop`` strings (the module's rules). Without the model's
    vocabulary, without ids, or with ids whose text does not begin with
    ``text`` (or that hold a control token): ``text`` whole, no ids."""
    whole = VerifiedText(text=text, exemption="")
    pieces = token_pieces(model_id) if token_ids else None
    if pieces is None or not text:
        return whole
    if any(not (0 <= token < len(pieces)) for token in token_ids):
        return whole
    ends = list(accumulate(len(pieces[token]) for token in token_ids))
    marked, cut_ends = _decode(b"".join(pieces[token] for token in token_ids))
    if marked.replace(_CUT, "\ufffd")[: len(text)] != text:
        return whole  # (not the ids' text: the count check judges that)
    if not all(pieces[token] for token in token_ids):
        return whole  # (a control token: no text of the answer)
    exemption, kept, ids = "", len(text), list(token_ids)
    if len(marked) > len(text):  # the last token's text runs on past the answer
        if not _stop_begins(marked[len(text) :].replace(_CUT, "\ufffd"), stop):
            return whole
        exemption = STOP_CUT
        kept = len(_decode(b"".join(pieces[token] for token in token_ids[:-1]))[0])
        if kept > len(text):
            return whole  # (more than the last token runs on: no stop cut)
        ids = ids[:-1]
    kept_text = marked[:kept]
    if _CUT not in kept_text:
        return VerifiedText(text=kept_text, exemption=exemption, token_ids=ids)
    if not set(cut_ends) <= {0, *ends}:  # not cut where a token ends: text
        return VerifiedText(
            text=kept_text.replace(_CUT, "\ufffd"), exemption=exemption, token_ids=ids
        )
    return VerifiedText(
        text=kept_text.replace(_CUT, ""), exemption=CUT_CHARACTER, token_ids=ids
    )


def _decode(raw: bytes) -> tuple[str, list[int]]:
    """``raw`` decoded as the agent decodes generated bytes (UTF-8, each
    maximal invalid sequence one character, ``_CUT`` here; an unfinished
    last character held back; NUL dropped), and the byte offsets where each
    invalid sequence ended."""
    _cut_ends.ends = []
    text, _ = codecs.utf_8_decode(raw, "ballast.cut", False)
    return text.replace("\x00", ""), list(_cut_ends.ends)


def _stop_begins(rest: str, stop: Sequence[str] | str | None) -> bool:
    """Whether ``rest`` (the text of the last token past the answer) is where
    one of ``stop`` begins: it starts with that string, or is its start (the
    agent held it back as a possible stop)."""
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    return any(s and (rest.startswith(s) or s.startswith(rest)) for s in stops)
