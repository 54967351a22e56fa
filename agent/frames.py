"""Parsing of coordinator frames (``ballast.host.v1``) for the agent."""

from __future__ import annotations

import json
import logging
from typing import Any

from agent.engines.base import GenerationRequest

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 2000
"""Error texts sent to the coordinator are cut to this length (characters)."""
MAX_VERIFY_TOKEN_IDS = 8192
"""The most token ids a ``verify`` frame's answer may carry (a verified answer
has at most 2,048)."""


def request_from_offer(frame: dict[str, Any], device: int) -> GenerationRequest:
    """Build a ``GenerationRequest`` from an offer.

    Raises ``ValueError`` naming the bad field.
    """
    if frame.get("device", device) != device:
        raise ValueError(
            f"device {frame.get('device')!r} is not served here (device {device})"
        )
    model = frame.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError("offer without a model")
    messages, prompt = frame.get("messages"), frame.get("prompt")
    if messages is not None:
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) for m in messages
        ):
            raise ValueError("messages must be a list of objects")
        prompt = None
    elif not isinstance(prompt, str):
        raise ValueError("offer has neither messages nor a prompt")
    params = frame.get("params") or {}
    if not isinstance(params, dict):
        raise ValueError("params must be an object")
    for key in ("max_tokens", "seed"):
        if params.get(key) is not None and (
            not isinstance(params[key], int) or isinstance(params[key], bool)
        ):
            raise ValueError(f"params.{key} must be an integer")
    for key in ("temperature", "top_p"):
        if params.get(key) is not None and not isinstance(params[key], (int, float)):
            raise ValueError(f"params.{key} must be a number")
    stop = params.get("stop")
    if (
        stop is not None
        and not isinstance(stop, str)
        and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise ValueError("params.stop must be a string or a list of strings")
    continue_from = frame.get("continue_from") or ""
    if not isinstance(continue_from, str):
        raise ValueError("continue_from must be a string")
    response_format = frame.get("response_format")
    if response_format is not None:
        response_format_check(response_format)
    logprobs = frame.get("logprobs")
    if logprobs is not None and (
        not isinstance(logprobs, int)
        or isinstance(logprobs, bool)
        or not 0 <= logprobs <= 20
    ):
        raise ValueError("logprobs must be an integer from 0 to 20")
    return GenerationRequest(
        model=model,
        messages=messages,
        prompt=prompt,
        params=params,
        continue_from=continue_from,
        response_format=response_format,
        logprobs=logprobs,
    )


def request_from_verify(
    frame: dict[str, Any], device: int
) -> tuple[GenerationRequest, str, list[int] | None]:
    """The request, the answer and the answer's token ids of a ``verify`` frame
    (an answer to score by prefill): its ``device``, ``model``, ``messages`` or
    ``prompt`` and ``params`` are checked as an offer's are, ``answer`` must be
    a string, ``token_ids`` absent, null or a list of at most
    ``MAX_VERIFY_TOKEN_IDS`` non-negative integers (docs/protocol-notes.md,
    2026-12-07).

    Raises ``ValueError`` naming the bad field.
    """
    answer = frame.get("answer")
    if not isinstance(answer, str):
        raise ValueError("verify: answer must be a string")
    token_ids = frame.get("token_ids")
    if token_ids is not None and not (
        isinstance(token_ids, list)
        and len(token_ids) <= MAX_VERIFY_TOKEN_IDS
        and all(type(t) is int and t >= 0 for t in token_ids)
    ):
        raise ValueError(
            "verify: token_ids must be a list of at most "
            f"{MAX_VERIFY_TOKEN_IDS} non-negative integers"
        )
    try:
        request = request_from_offer(frame, device)
    except ValueError as exc:
        raise ValueError(f"verify: {exc}") from None
    return request, answer, token_ids


def response_format_check(value: Any) -> None:
    """Raise ``ValueError`` unless ``value`` is a ``json_object``, a
    ``json_schema`` with a schema, or a ``json_sequence`` (since 2026-12-07):
    a schema, ``prefix``/``suffix``/``separator`` strings, ``min_items`` and
    ``max_items`` counts (``max_items`` absent: unbounded), ``text_unless`` a
    non-empty string or absent."""
    kind = value.get("type") if isinstance(value, dict) else None
    spec = value.get(kind) if kind in ("json_schema", "json_sequence") else None
    if kind == "json_object":
        return
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise ValueError(
            "response_format must be a json_object, or a json_schema or "
            "json_sequence with a schema"
        )
    if kind == "json_schema":
        return
    texts = [spec.get(k, "") for k in ("prefix", "suffix", "separator")]
    least, most = spec.get("min_items", 1), spec.get("max_items")
    unless = spec.get("text_unless")
    if (
        not all(isinstance(t, str) for t in texts)
        or type(least) is not int
        or least < 0
        or (most is not None and (type(most) is not int or most < max(least, 1)))
        or (unless is not None and (not isinstance(unless, str) or not unless))
    ):
        raise ValueError(
            "response_format.json_sequence: prefix, suffix and separator must be "
            "strings, min_items <= max_items counts, text_unless a non-empty string"
        )


def frame_parse(message: str | bytes) -> dict[str, Any] | None:
    """Decode a frame; None (logged) when it is not a JSON object with a type."""
    try:
        frame = json.loads(message)
    except (ValueError, TypeError):
        log.warning("ignoring a frame that is not JSON: %.80r", message)
        return None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        log.warning("ignoring a frame without a type: %.80r", message)
        return None
    if log.isEnabledFor(logging.DEBUG):  # the summary is a JSON encoding
        log.debug("received %s", frame_summary(frame))
    return frame


def frame_summary(frame: dict[str, Any]) -> str:
    summary = {
        k: v
        for k, v in frame.items()
        if k not in ("messages", "prompt", "devices", "answer", "tokens")
    }
    return json.dumps(summary, ensure_ascii=False)[:200]
