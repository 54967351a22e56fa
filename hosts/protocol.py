"""Validation of ``ballast.host.v1`` frames (PROTOCOL.md §2).

Each ``parse_*`` takes the decoded JSON object of one frame and returns it cleaned,
or raises ``FrameError`` with a message naming the bad field. Nothing here touches
the database, so a malformed frame is refused before it can change anything.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from django.conf import settings

PROTOCOL_NAME = "ballast.host.v1"
MAX_TEXT_CHARS = 65536
# what an engine may declare it does beyond text (``hello.features``;
# docs/protocol-notes.md "Output features"): a request that needs one goes only
# to devices whose machine declared it
FEATURES = ("json_object", "json_schema", "json_sequence", "logprobs", "token_ids")
MAX_FEATURES = 32  # entries of ``hello.features``, known or not
SHA256_HEX = re.compile(r"[0-9a-f]{64}")  # a file's digest as a heartbeat declares it
VERIFICATION_ID = re.compile(r"[0-9a-f]{32}")  # a verify frame's job (a UUID's hex)
# what a hello may declare a device is (``devices[].kind``; docs/protocol-notes.md
# 2026-12-07): its word only, placement goes by what was measured
DEVICE_KINDS = ("gpu", "cpu")


def max_devices() -> int:
    """Devices a machine may declare (``BALLAST_MAX_DEVICES_PER_MACHINE``, 16):
    at most that many in a ``hello``, indexes 0 to that − 1, so a machine never
    has more device rows whatever its hellos say."""
    return settings.BALLAST_MAX_DEVICES_PER_MACHINE


def max_slots() -> int:
    """Slots a device may report (``BALLAST_MAX_SLOTS_PER_DEVICE``, 64)."""
    return settings.BALLAST_MAX_SLOTS_PER_DEVICE


class FrameError(ValueError):
    """A frame that does not follow PROTOCOL.md §2; the message names the field."""


def _require(frame: dict[str, Any], field: str, kind: type | tuple[type, ...]) -> Any:
    if field not in frame:
        raise FrameError(f"{frame.get('type')}: missing field {field!r}")
    value = frame[field]
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise FrameError(f"{frame.get('type')}: field {field!r} must be a number")
    if not isinstance(value, kind):
        raise FrameError(f"{frame.get('type')}: field {field!r} has the wrong type")
    return value


def _str(
    frame: dict[str, Any], field: str, *, max_len: int = 200, empty: bool = False
) -> str:
    value = _require(frame, field, str)
    if not empty and not value:
        raise FrameError(f"{frame.get('type')}: field {field!r} must not be empty")
    if len(value) > max_len:
        raise FrameError(
            f"{frame.get('type')}: field {field!r} is over {max_len} characters"
        )
    return _utf8(value, f"{frame.get('type')}: field {field!r}")


def _utf8(value: str, where: str) -> str:
    """``value`` if it is storable text: valid UTF-8 (no lone surrogates) and no
    NUL (PostgreSQL text cannot hold it); FrameError otherwise."""
    if "\x00" in value:
        raise FrameError(f"{where} must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise FrameError(f"{where} is not valid UTF-8 text") from None
    return value


MAX_INT = 2**31 - 1  # database integer columns


def _nonneg_int(value: Any, where: str) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 0 <= value <= MAX_INT
    ):
        raise FrameError(f"{where} must be an integer from 0 to {MAX_INT}")
    return value


def parse_hello(frame: dict[str, Any]) -> dict[str, Any]:
    """Check a ``hello``: agent version, engine, Ed25519 key, devices.

    Returns ``{"agent_version", "engine_name", "engine_version", "public_key",
    "accepts_serverless", "features", "verifies", "devices": [{"index",
    "name", "kind", "vram_total_mb"}]}``; ``kind``: ``DEVICE_KINDS``, absent
    ``"gpu"`` (a ``cpu``'s ``vram_total_mb`` is its system memory);
    ``features``: the known ``FEATURES`` the
    hello declares, sorted (a feature this coordinator does not know is
    ignored; none declared: none); ``verifies``: its engine scores answers by
    prefill (``verify`` offers; absent: False).
    """
    engine = _require(frame, "engine", dict)
    key = _str(frame, "public_key", max_len=64)
    try:
        raw = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        raise FrameError("hello: public_key is not base64") from None
    if len(raw) != 32:
        raise FrameError("hello: public_key must be 32 raw bytes (Ed25519), base64")
    devices = _require(frame, "devices", list)
    if not devices or len(devices) > max_devices():
        raise FrameError(f"hello: devices must list 1 to {max_devices()} devices")
    cleaned = []
    seen: set[int] = set()
    for i, dev in enumerate(devices):
        if not isinstance(dev, dict):
            raise FrameError(f"hello: devices[{i}] must be an object")
        index = _nonneg_int(dev.get("index"), f"hello: devices[{i}].index")
        if index >= max_devices():
            raise FrameError(
                f"hello: devices[{i}].index must be below {max_devices()}"
                " (BALLAST_MAX_DEVICES_PER_MACHINE)"
            )
        if index in seen:
            raise FrameError(f"hello: devices[{i}].index {index} is repeated")
        seen.add(index)
        name = dev.get("name")
        if not isinstance(name, str) or not name or len(name) > 200:
            raise FrameError(f"hello: devices[{i}].name must be 1-200 characters")
        _utf8(name, f"hello: devices[{i}].name")
        vram = _nonneg_int(
            dev.get("vram_total_mb"), f"hello: devices[{i}].vram_total_mb"
        )
        kind = dev.get("kind", "gpu")
        if kind not in DEVICE_KINDS:
            raise FrameError(f"hello: devices[{i}].kind must be 'gpu' or 'cpu'")
        cleaned.append(
            {"index": index, "name": name, "kind": kind, "vram_total_mb": vram}
        )
    accepts = frame.get("accepts_serverless", True)
    if not isinstance(accepts, bool):
        raise FrameError("hello: accepts_serverless must be true or false")
    verifies = frame.get("verifies", False)
    if not isinstance(verifies, bool):
        raise FrameError("hello: verifies must be true or false")
    engine_name = engine.get("name")
    engine_version = engine.get("version", "")
    if not isinstance(engine_name, str) or not engine_name or len(engine_name) > 64:
        raise FrameError("hello: engine.name must be 1-64 characters")
    if not isinstance(engine_version, str) or len(engine_version) > 64:
        raise FrameError(
            "hello: engine.version must be a string of at most 64 characters"
        )
    return {
        "agent_version": _str(frame, "agent_version", max_len=32),
        "engine_name": _utf8(engine_name, "hello: engine.name"),
        "engine_version": _utf8(engine_version, "hello: engine.version"),
        "public_key": key,
        "accepts_serverless": accepts,
        "features": _features(frame.get("features", [])),
        "verifies": verifies,
        "devices": cleaned,
    }


def _features(value: Any) -> list[str]:
    """The known ``FEATURES`` of a hello's ``features`` list, sorted."""
    if (
        not isinstance(value, list)
        or len(value) > MAX_FEATURES
        or not all(isinstance(f, str) and 0 < len(f) <= 64 for f in value)
    ):
        raise FrameError(
            f"hello: features must be a list of at most {MAX_FEATURES} names"
        )
    return sorted(set(value) & set(FEATURES))


def device_known(frame_type: str, index: int, known: frozenset[int]) -> int:
    """``index`` if the connection's ``hello`` declared that device (``known``:
    its indexes); FrameError naming the frame otherwise (a retired or made-up
    device)."""
    if index not in known:
        raise FrameError(
            f"{frame_type}: device {index} was not declared in this connection's hello"
        )
    return index


def parse_heartbeat(frame: dict[str, Any], *, known: frozenset[int]) -> dict[str, Any]:
    """Check a ``heartbeat``: per-device telemetry and the agent's pause flag.

    ``known``: the device indexes of the connection's ``hello``; a report of
    another device, a repeated one, or more than ``max_slots()`` slots is
    refused (FrameError). Returns ``{"paused", "devices": [{"index", "temp_c"
    (°C or None), "vram_free_mb", "loaded_models": [id], "slots", "weights":
    {id: {"sha256", "quantization"}}}]}`` (``_weights``).
    """
    devices = _require(frame, "devices", list)
    if len(devices) > max_devices():
        raise FrameError(f"heartbeat: at most {max_devices()} devices")
    paused = frame.get("paused", False)
    if not isinstance(paused, bool):
        raise FrameError("heartbeat: paused must be true or false")
    cleaned = []
    seen: set[int] = set()
    for i, dev in enumerate(devices):
        if not isinstance(dev, dict):
            raise FrameError(f"heartbeat: devices[{i}] must be an object")
        index = device_known(
            "heartbeat",
            _nonneg_int(dev.get("index"), f"heartbeat: devices[{i}].index"),
            known,
        )
        if index in seen:
            raise FrameError(f"heartbeat: devices[{i}].index {index} is repeated")
        seen.add(index)
        temp = dev.get("temp_c")
        if temp is not None and (
            isinstance(temp, bool)
            or not isinstance(temp, (int, float))
            or not -50 <= temp <= 200
        ):
            raise FrameError(
                f"heartbeat: devices[{i}].temp_c must be °C (-50..200) or null"
            )
        vram_free = _nonneg_int(
            dev.get("vram_free_mb"), f"heartbeat: devices[{i}].vram_free_mb"
        )
        slots = _nonneg_int(dev.get("slots"), f"heartbeat: devices[{i}].slots")
        if slots > max_slots():
            raise FrameError(
                f"heartbeat: devices[{i}].slots must be at most {max_slots()}"
                " (BALLAST_MAX_SLOTS_PER_DEVICE)"
            )
        models_ = dev.get("loaded_models", [])
        if not isinstance(models_, list) or not all(
            isinstance(m, str) and 0 < len(m) <= 100 and m.isprintable()
            for m in models_
        ):
            raise FrameError(
                f"heartbeat: devices[{i}].loaded_models must be a list of model ids"
            )
        cleaned.append(
            {
                "index": index,
                "temp_c": float(temp) if temp is not None else None,
                "vram_free_mb": vram_free,
                "slots": slots,
                "loaded_models": sorted(set(models_)),
                "weights": _weights(dev.get("weights", {}), set(models_), i),
            }
        )
    return {"paused": paused, "devices": cleaned}


def _weights(value: Any, loaded: set[str], i: int) -> dict[str, dict[str, str]]:
    """A heartbeat device's ``weights`` (docs/protocol-notes.md 2026-12-07):
    ``{model id: {"sha256": 64 lowercase hex digits, "quantization": text}}``
    for models of its ``loaded_models``, the digest of the file its engine
    loaded; ``quantization`` optional (""). Absent: ``{}`` (an agent of before
    that date). FrameError naming the entry otherwise."""
    where = f"heartbeat: devices[{i}].weights"
    if not isinstance(value, dict):
        raise FrameError(f"{where} must be an object (model id: weights)")
    cleaned = {}
    for model, weights in value.items():
        if model not in loaded:
            raise FrameError(f"{where} names {model[:100]!r}, not in its loaded_models")
        if not isinstance(weights, dict):
            raise FrameError(f"{where}[{model!r}] must be an object")
        digest = weights.get("sha256")
        if not isinstance(digest, str) or not SHA256_HEX.fullmatch(digest):
            raise FrameError(
                f"{where}[{model!r}].sha256 must be 64 lowercase hex digits"
            )
        quantization = weights.get("quantization", "")
        if (
            not isinstance(quantization, str)
            or len(quantization) > 32
            or not quantization.isprintable()
        ):
            raise FrameError(
                f"{where}[{model!r}].quantization must be at most 32 characters"
            )
        cleaned[model] = {"sha256": digest, "quantization": quantization}
    return cleaned


def parse_job_frame(frame: dict[str, Any]) -> str:
    """Return the ``job`` (attempt id) of a claim/token/done/error frame."""
    return _str(frame, "job", max_len=100)


def parse_verification_frame(frame: dict[str, Any]) -> str:
    """Return the ``job`` of a ``scores`` frame: the ``job`` of the ``verify``
    it answers, 32 hex digits (FrameError otherwise: nothing else names a
    verification)."""
    value = _str(frame, "job", max_len=100)
    if not VERIFICATION_ID.fullmatch(value):
        raise FrameError("scores: job must be the verify frame's job (32 hex digits)")
    return value


def parse_token(frame: dict[str, Any]) -> str:
    """Return the ``text`` of a ``token`` frame (1..65536 characters)."""
    return _str(frame, "text", max_len=MAX_TEXT_CHARS)


def parse_done(frame: dict[str, Any]) -> dict[str, Any]:
    """Check a ``done``: finish reason, usage, receipt and the optional
    ``token_ids`` (the ids of the counted tokens as the host's sampler drew
    them, docs/protocol-notes.md 2026-12-06: exactly
    ``usage.completion_tokens`` non-negative integers).

    Returns ``{"finish_reason", "prompt_tokens", "completion_tokens",
    "receipt", "token_ids"}`` (``token_ids`` None when the frame has none).
    """
    reason = frame.get("finish_reason", "stop")
    if reason not in ("stop", "length"):
        raise FrameError("done: finish_reason must be 'stop' or 'length'")
    checked = _usage_receipt(frame, "done")
    ids = frame.get("token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(
            type(token) is int and 0 <= token < 2**31 for token in ids
        ):
            raise FrameError("done: token_ids must be a list of token ids (integers)")
        if len(ids) != checked["completion_tokens"]:
            raise FrameError(
                "done: token_ids must hold usage.completion_tokens ids "
                f"({len(ids)} for {checked['completion_tokens']})"
            )
    return {"finish_reason": reason, **checked, "token_ids": ids}


def parse_error_message(frame: dict[str, Any]) -> str:
    """The ``message`` of an ``error`` frame as storable text, at most 2,000
    characters: "" when it is missing or not a string, NUL characters dropped,
    what is not valid UTF-8 (a lone surrogate) replaced. Never refused: an
    ``error`` ends its attempt whatever its message says."""
    message = frame.get("message")
    if not isinstance(message, str):
        return ""
    message = message[:2000].replace("\x00", "")
    return message.encode("utf-8", errors="replace").decode("utf-8")


def parse_hello_proof(frame: dict[str, Any]) -> str:
    """Return the ``proof`` of a ``hello`` (base64 Ed25519 signature over the
    connection's ``challenge``, ``billing.receipts.challenge_message``); ''
    when the hello carries none (a ``ballast.host.v1`` agent of before
    2026-12-01, refused: docs/protocol-notes.md)."""
    proof = frame.get("proof", "")
    if not isinstance(proof, str) or len(proof) > 200:
        raise FrameError("hello: proof must be a base64 string")
    return proof


def parse_cancelled(frame: dict[str, Any]) -> dict[str, Any]:
    """Check a ``cancelled`` (the answer to a ``cancel``): usage and receipt
    over the text sent for the job.

    Returns ``{"prompt_tokens", "completion_tokens", "receipt"}``.
    """
    usage = _require(frame, "usage", dict)
    prompt = _nonneg_int(
        usage.get("prompt_tokens", 0), "cancelled: usage.prompt_tokens"
    )
    completion = _nonneg_int(
        usage.get("completion_tokens"), "cancelled: usage.completion_tokens"
    )
    receipt = frame.get("receipt", "")
    if not isinstance(receipt, str) or len(receipt) > 200:
        raise FrameError("cancelled: receipt must be a base64 string")
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "receipt": receipt,
    }


def parse_scores(frame: dict[str, Any]) -> dict[str, Any]:
    """Check the envelope of a ``scores`` (the answer to a ``verify``): its
    ``tokens`` a list (each entry is the judge's to check:
    ``trust.verification.plausibility.token_scores_parse``), usage and receipt.
    The frame's size is bounded by the consumer (256 KiB).

    Returns ``{"tokens", "prompt_tokens", "completion_tokens", "receipt"}``.
    """
    tokens = _require(frame, "tokens", list)
    checked = _usage_receipt(frame, "scores")
    if checked["completion_tokens"] != len(tokens):
        raise FrameError("scores: usage.completion_tokens must be the number of tokens")
    return {"tokens": tokens, **checked}


def _usage_receipt(frame: dict[str, Any], kind: str) -> dict[str, Any]:
    """The ``usage`` counts and the ``receipt`` of a ``done`` or ``scores``
    frame (``kind`` names it in the error): ``{"prompt_tokens",
    "completion_tokens", "receipt"}``."""
    usage = _require(frame, "usage", dict)
    prompt = _nonneg_int(usage.get("prompt_tokens", 0), f"{kind}: usage.prompt_tokens")
    completion = _nonneg_int(
        usage.get("completion_tokens"), f"{kind}: usage.completion_tokens"
    )
    receipt = frame.get("receipt", "")
    if not isinstance(receipt, str) or len(receipt) > 200:
        raise FrameError(f"{kind}: receipt must be a base64 string")
    return {"prompt_tokens": prompt, "completion_tokens": completion, "receipt": receipt}


def parse_model_load_failed(frame: dict[str, Any]) -> dict[str, Any]:
    """Check a ``model_load_failed``: ``{"device", "model", "error"}``."""
    return {
        "device": _nonneg_int(frame.get("device"), "model_load_failed: device"),
        "model": _str(frame, "model", max_len=100),
        "error": _str(frame, "error", max_len=4000),
    }


def parse_benchmark(frame: dict[str, Any]) -> dict[str, Any]:
    """Check a ``benchmark``: device, model, tokens/s, ttft (ms), VRAM used (MiB)."""
    out: dict[str, Any] = {
        "device": _nonneg_int(frame.get("device"), "benchmark: device"),
        "model": _str(frame, "model", max_len=100),
    }
    for field in ("tokens_per_s", "ttft_ms"):
        value = frame.get(field)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 <= value <= 1e9  # NaN and infinities fail this too
        ):
            raise FrameError(f"benchmark: {field} must be a finite non-negative number")
        out[field] = float(value)
    vram = frame.get("vram_used_mb")
    out["vram_used_mb"] = (
        None if vram is None else _nonneg_int(vram, "benchmark: vram_used_mb")
    )
    return out
