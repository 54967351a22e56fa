"""What a catalog entry pins and states of a model, read from its GGUF file.

``model_entry_read(path)`` gives a ``ModelEntry``: the file's ``ModelFile``
(digest, quantization, family, context length, vocabulary and template) and
what the catalog derives from its metadata: the special tokens, the chat
template's tool-call format, and the VRAM the weights and one request's
context need (estimates, MiB). ``weights_read(path)`` is the part an agent
declares of the file it loaded: digest and quantization.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .modelfile import (
    ModelFile,
    ModelFileError,
    VocabData,
    _quantization,
    _reader,
    file_sha256,
    model_file_read,
)

MIB = 1 << 20

KV_BYTES = 2
"""Bytes per cached key or value element: llama.cpp's default KV cache type, F16."""

OUTPUT_BATCH_TOKENS = 512
"""Tokens whose logits (float32, one per vocabulary entry) llama.cpp's output
buffer holds at once (its default ``n_ubatch``)."""

TOOL_CALL_FORMATS = {
    "hermes": "<tool_call>",  # Hermes, Qwen 2/2.5/3, SmolLM3: <tool_call>{json}</tool_call>
    "mistral": "[TOOL_CALLS]",  # Mistral: [TOOL_CALLS][{json}]
    "llama3": "<|python_tag|>",  # Llama 3.1+: <|python_tag|> or {"name", "parameters"}
    "granite": "<|tool_call|>",  # Granite, Phi-4-mini: <|tool_call|>[{json}]
    "deepseek": "<｜tool▁calls▁begin｜>",  # DeepSeek V3/R1
}
"""How a chat template writes a tool call, by the marker it prints before one.
A template that takes ``tools`` without any of them is ``"other"``; one that
never mentions ``tools`` has none (``""``)."""

_TOOLS_USED = re.compile(r"\btools\b")
_LLAMA3_JSON = re.compile(r"""["']parameters["']""")

SPECIAL_TOKENS = ("bos", "eos", "eot", "eom", "unk", "sep", "pad")
"""The special tokens an entry lists, by their ``VocabData`` id field (``bos_id``…)."""


@dataclass(frozen=True)
class Weights:
    """What identifies a model file's weights: ``sha256`` (hex digest of the
    whole file, the name Ollama gives its blob) and ``quantization`` (llama.cpp's
    name of its file type, "Q4_1"; "" when the file does not say)."""

    sha256: str
    quantization: str


@dataclass(frozen=True)
class ModelEntry:
    """A catalog entry's facts about a GGUF file.

    - ``file``: the ``ModelFile`` (digest, quantization, family, context,
      vocabulary and chat template).
    - ``special_tokens``: ``{"bos": {"id": 1, "text": "<|im_start|>"}, …}``,
      the ``SPECIAL_TOKENS`` the file sets.
    - ``tool_call_format``: a key of ``TOOL_CALL_FORMATS``, ``"other"``, or
      ``""`` (the template has no tools).
    - ``kv_bytes_per_token``: bytes of KV cache one token of context takes
      (F16 keys and values of every layer).
    - ``vram_weights_mb``: MiB of tensor data, rounded up.
    """

    file: ModelFile
    special_tokens: dict[str, dict[str, Any]]
    tool_call_format: str
    kv_bytes_per_token: int
    vram_weights_mb: int

    def vram_per_request_mb(self, context_length: int) -> int:
        """MiB one request of ``context_length`` tokens needs beside the weights
        (an estimate): its KV cache, plus the output buffer of
        ``OUTPUT_BATCH_TOKENS`` tokens' float32 logits, rounded up."""
        output = OUTPUT_BATCH_TOKENS * len(self.file.vocab.tokens) * 4
        return math.ceil((self.kv_bytes_per_token * context_length + output) / MIB)


def model_entry_read(path: str | Path) -> ModelEntry:
    """Read the GGUF file at ``path`` for a catalog entry (see ``ModelEntry``).

    Reads the whole file once for its digest and its metadata twice (a few
    seconds for a large vocabulary). Raises ``modelfile.ModelFileError`` for
    a file that is not GGUF, has no vocabulary or no layer shape, ``OSError``
    when it cannot be read.
    """
    file = model_file_read(path)
    metadata = _fields(_reader(path), "general.", f"{file.architecture}.")
    return ModelEntry(
        file=file,
        special_tokens=special_tokens(file.vocab),
        tool_call_format=tool_call_format(file.vocab.chat_template),
        kv_bytes_per_token=kv_bytes_per_token(metadata, file.architecture),
        vram_weights_mb=math.ceil(file.weights_bytes / MIB),
    )


def weights_read(path: str | Path, *, sha256: str | None = None) -> Weights:
    """The ``Weights`` of the GGUF file at ``path``: its digest (reads the
    whole file, about 1 s per GB; ``sha256`` when it is known already, as an
    Ollama blob's name says it) and quantization (its metadata).

    Raises ``modelfile.ModelFileError`` for a file that is not GGUF,
    ``OSError`` when it cannot be read.
    """
    reader = _reader(path)
    file_type = _fields(reader, "general.").get("general.file_type")
    return Weights(
        sha256=sha256 or file_sha256(path),
        quantization=_quantization(reader, file_type),
    )


def _fields(reader, *prefixes: str) -> dict[str, Any]:
    """The values of the file's keys that start with one of ``prefixes`` (the
    vocabulary's large arrays are left unread: reading them is most of the
    time a file's metadata takes)."""
    return {
        key: field.contents()
        for key, field in reader.fields.items()
        if key.startswith(prefixes)
    }


def special_tokens(vocab: VocabData) -> dict[str, dict[str, Any]]:
    """The special tokens ``vocab`` sets: ``{name: {"id", "text"}}`` for each of
    ``SPECIAL_TOKENS`` with an id inside the vocabulary."""
    tokens = {}
    for name in SPECIAL_TOKENS:
        token = getattr(vocab, f"{name}_id")
        if token is not None and 0 <= token < len(vocab.tokens):
            tokens[name] = {"id": token, "text": vocab.token_text(token)}
    return tokens


def tool_call_format(template: str) -> str:
    """How the chat ``template`` (Jinja source) writes a tool call: a key of
    ``TOOL_CALL_FORMATS`` by the marker it prints, ``"llama3"`` for Llama 3's
    JSON calls (``{"name": …, "parameters": …}``) without the python tag,
    ``"other"`` for a template that takes ``tools`` otherwise, ``""`` for one
    that does not take ``tools``."""
    if not _TOOLS_USED.search(template):
        return ""
    for name, marker in TOOL_CALL_FORMATS.items():
        if marker in template:
            return name
    if "ipython" in template and _LLAMA3_JSON.search(template):
        return "llama3"
    return "other"


def kv_bytes_per_token(metadata: dict[str, Any], architecture: str) -> int:
    """Bytes of F16 KV cache per token of context, from the file's
    ``{arch}.block_count``, ``.embedding_length``, ``.attention.head_count``,
    ``.attention.head_count_kv`` (an int, or one per layer) and the optional
    ``.attention.key_length`` / ``.value_length``, as llama.cpp sizes its
    cache. Raises ``modelfile.ModelFileError`` when the shape keys are missing."""

    def key(name: str) -> Any:
        return metadata.get(f"{architecture}.{name}")

    layers, embedding, heads = (
        key("block_count"),
        key("embedding_length"),
        key("attention.head_count"),
    )
    if not layers or not embedding or not heads:
        raise ModelFileError(
            f"the file lacks {architecture}.block_count, .embedding_length or"
            " .attention.head_count (the model's layer shape)"
        )
    heads_kv = key("attention.head_count_kv")
    per_layer = heads_kv if isinstance(heads_kv, list) else [heads_kv or heads] * layers
    head_max = max(heads) if isinstance(heads, list) else heads
    key_length = key("attention.key_length") or embedding // head_max
    value_length = key("attention.value_length") or embedding // head_max
    return sum(int(h) * (key_length + value_length) * KV_BYTES for h in per_layer)
