"""Read the metadata of a GGUF model file (no tensors, no llama.cpp needed).

Used by the OpenAI-server engine to get a model's chat template and special
tokens from the GGUF file when the server does not expose them. Format: GGUF
v2/v3, little-endian (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

_SCALARS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i",
    6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """The file is not a GGUF file this reader understands."""


def gguf_metadata(path: str | Path) -> dict[str, Any]:
    """Return every metadata key/value of the GGUF file at ``path``.

    Strings are decoded as UTF-8 (invalid bytes replaced); arrays become lists.
    Raises ``GGUFError`` for a file that is not GGUF v2/v3, ``OSError`` when it
    cannot be read.
    """
    with open(path, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file")
        (version,) = _unpack(handle, "<I")
        if version not in (2, 3):
            raise GGUFError(f"{path}: unsupported GGUF version {version}")
        _tensor_count, kv_count = _unpack(handle, "<QQ")
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = _read_string(handle)
            (value_type,) = _unpack(handle, "<I")
            metadata[key] = _read_value(handle, value_type)
        return metadata


def gguf_chat_template(path: str | Path) -> tuple[str, str, str]:
    """Return ``(chat template, bos token text, eos token text)`` of a GGUF file.

    Missing entries are empty strings. Raises like ``gguf_metadata``.
    """
    metadata = gguf_metadata(path)
    tokens = metadata.get("tokenizer.ggml.tokens") or []

    def token(key: str) -> str:
        index = metadata.get(key)
        return (
            tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else ""
        )

    return (
        str(metadata.get("tokenizer.chat_template", "")),
        token("tokenizer.ggml.bos_token_id"),
        token("tokenizer.ggml.eos_token_id"),
    )


def _unpack(handle: BinaryIO, fmt: str) -> tuple[Any, ...]:
    size = struct.calcsize(fmt)
    data = handle.read(size)
    if len(data) != size:
        raise GGUFError("truncated GGUF metadata")
    return struct.unpack(fmt, data)


def _read_string(handle: BinaryIO) -> str:
    (length,) = _unpack(handle, "<Q")
    data = handle.read(length)
    if len(data) != length:
        raise GGUFError("truncated GGUF string")
    return data.decode("utf-8", errors="replace")


def _read_value(handle: BinaryIO, value_type: int) -> Any:
    if value_type in _SCALARS:
        return _unpack(handle, _SCALARS[value_type])[0]
    if value_type == _STRING:
        return _read_string(handle)
    if value_type == _ARRAY:
        item_type, count = _unpack(handle, "<IQ")
        if item_type in _SCALARS:
            fmt = _SCALARS[item_type]
            return list(_unpack(handle, "<" + fmt[1:] * count)) if count else []
        return [_read_value(handle, item_type) for _ in range(count)]
    raise GGUFError(f"unknown GGUF value type {value_type}")
