"""llama.cpp's vocabulary read whole: the bytes of each token, and a token's text."""

from __future__ import annotations

from typing import Any


def vocab_pieces(llama: Any, *, special: bool = False) -> list[bytes]:
    """Bytes of every token of ``llama``'s vocabulary, indexed by token id
    (special tokens give ``b""``, or their text with ``special``).

    Whole pieces: llama-cpp-python's own ``detokenize`` reads each into 32
    bytes and drops a longer one (SmolLM2 has a 64-dash token).
    """
    import ctypes

    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    buffer = ctypes.create_string_buffer(256)
    pieces = []
    for token in range(llama.n_vocab()):
        size = llama_cpp.llama_token_to_piece(
            vocab, token, buffer, len(buffer), 0, special
        )
        if size < 0:  # longer than the buffer: retry with the size asked for
            bigger = ctypes.create_string_buffer(-size)
            size = llama_cpp.llama_token_to_piece(
                vocab, token, bigger, -size, 0, special
            )
            pieces.append(bigger.raw[:size])
        else:
            pieces.append(buffer.raw[:size])
    return pieces


def token_text(llama: Any, token: int) -> str:
    """The text of special token ``token`` (BOS, EOS); "" when there is none."""
    if token is None or token < 0:
        return ""
    try:
        return llama.detokenize([token], special=True).decode("utf-8", errors="replace")
    except Exception:
        return ""
