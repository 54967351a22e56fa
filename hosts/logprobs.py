"""The ``logprobs`` of ``token`` frames (docs/protocol-notes.md "Output
features"): each frame's entries checked, and an attempt's entries held within
the bytes of the text its host sent, so that a cut of the text cuts its
entries. Nothing here touches the database (as ``hosts.protocol``)."""

from __future__ import annotations

from typing import Any

from .protocol import FrameError, _utf8

MAX_TOKEN_BYTES = 256  # bytes of one token of a ``token`` frame's logprobs


class TokenLogprobs:
    """The log-probabilities of one attempt's ``token`` frames, whose offer
    asked for ``top`` alternatives per token."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.text_bytes = 0  # of the frames' text so far
        self.entry_bytes = 0  # of their entries' tokens

    def parse(self, frame: dict[str, Any]) -> list[dict]:
        """The frame's entries (``parse_token_logprobs``); FrameError also when
        the attempt's entries come to more bytes than its text."""
        entries = parse_token_logprobs(frame, top=self.top)
        self.text_bytes += len(frame["text"].encode("utf-8"))
        self.entry_bytes += sum(len(entry["bytes"]) for entry in entries)
        if self.entry_bytes > self.text_bytes:
            raise FrameError(
                "token: the logprobs' tokens have more bytes than the text sent"
            )
        return entries


def parse_token_logprobs(frame: dict[str, Any], *, top: int) -> list[dict]:
    """The ``logprobs`` of a ``token`` frame of an attempt whose offer asked
    for them with ``top`` alternatives per token: a list (empty when the
    frame's text completes no token) of ``{"token", "logprob", "bytes",
    "top_logprobs": [{"token", "logprob", "bytes"}]}`` (OpenAI's chat shape),
    ``logprob`` a finite number ≤ 0, ``bytes`` the token's 1 to 256 bytes,
    at most ``top`` alternatives. FrameError when missing or malformed (an
    engine that drops what was asked fails the attempt, never silently)."""
    entries = frame.get("logprobs")
    if not isinstance(entries, list):
        raise FrameError("token: logprobs (a list) is required by this job's offer")
    text = frame.get("text", "")
    if len(entries) > len(text.encode("utf-8", errors="replace")):
        raise FrameError("token: more logprobs entries than bytes of text")
    cleaned = []
    for i, entry in enumerate(entries):
        where = f"token: logprobs[{i}]"
        if not isinstance(entry, dict):
            raise FrameError(f"{where} must be an object")
        alternatives = entry.get("top_logprobs", [])
        if not isinstance(alternatives, list) or len(alternatives) > top:
            raise FrameError(f"{where}.top_logprobs must list at most {top} tokens")
        item = _logprob(entry, where)
        item["top_logprobs"] = [
            _logprob(alt, f"{where}.top_logprobs[{j}]")
            for j, alt in enumerate(alternatives)
        ]
        cleaned.append(item)
    return cleaned


def _logprob(entry: Any, where: str) -> dict:
    """One ``{"token", "logprob", "bytes"}`` of a token frame, checked."""
    if not isinstance(entry, dict):
        raise FrameError(f"{where} must be an object")
    token, logprob, raw = entry.get("token"), entry.get("logprob"), entry.get("bytes")
    if not isinstance(token, str) or len(token) > MAX_TOKEN_BYTES:
        raise FrameError(f"{where}.token must be a string of a token")
    _utf8(token, f"{where}.token")
    if (
        isinstance(logprob, bool)
        or not isinstance(logprob, (int, float))
        or not -1e9 <= logprob <= 0  # NaN and infinities fail this too
    ):
        raise FrameError(f"{where}.logprob must be a finite number <= 0")
    if (
        not isinstance(raw, list)
        or not 0 < len(raw) <= MAX_TOKEN_BYTES
        or not all(
            isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 255
            for b in raw
        )
    ):
        raise FrameError(f"{where}.bytes must list the token's 1 to 256 bytes")
    return {"token": token, "logprob": float(logprob), "bytes": raw}
