"""A GGUF model file's chat template and special tokens, read without llama.cpp
(``modeldata.modelfile``, through the ``gguf`` package).

Used by the OpenAI-server engine to get a model's chat template and special
tokens from the GGUF file when the server does not expose them.
"""

from __future__ import annotations

from pathlib import Path

from modeldata.modelfile import ModelFileError, vocab_data_read

GGUFError = ModelFileError
"""The file is not a GGUF file, or has no vocabulary."""


def gguf_chat_template(path: str | Path) -> tuple[str, str, str]:
    """Return ``(chat template, bos token text, eos token text)`` of a GGUF file.

    Missing entries are empty strings. Raises ``GGUFError`` for a file that is
    not GGUF (or has no vocabulary), ``OSError`` when it cannot be read.
    """
    data = vocab_data_read(path)
    return (
        data.chat_template,
        data.token_text(data.bos_id),
        data.token_text(data.eos_id),
    )
