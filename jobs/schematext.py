"""What text a request's JSON may hold where it reaches a host's engine:
storable text everywhere (``json_text_checked``), and in the literals a
grammar spells out of a schema (property names, ``enum`` and ``const``
values) only what every engine's grammar can hold (``literals_checked``).

Found by driving the reference agent (llama.cpp's schema-to-grammar
converter and its grammar parser): a ``"`` in such a literal makes a grammar
llama.cpp refuses, and a NUL one its decoder drops, so the host fails the
job — counted against an honest device — unless it is refused here first.
"""

from __future__ import annotations

from typing import Any

from .errors import ApiError

GRAMMAR_UNSAFE = '"'
"""Characters no literal of a schema may hold (llama.cpp's converter writes
them unescaped into the grammar, which its parser then refuses)."""


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, "invalid_request", param=param)


def json_text_checked(value: Any, param: str) -> None:
    """ApiError 400 unless every string in JSON ``value`` (keys too) is
    storable text: valid UTF-8 (no lone surrogate), no NUL."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str):
            if "\x00" in node:
                raise _bad(param, f"'{param}' must not contain NUL characters")
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                raise _bad(param, f"'{param}' is not valid UTF-8 text") from None


def literals_checked(value: Any, path: str) -> None:
    """ApiError 400 naming ``path`` when a string of ``value`` (a property
    name, or an ``enum``/``const`` value, keys and members included) holds a
    character of ``GRAMMAR_UNSAFE``."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str) and any(c in node for c in GRAMMAR_UNSAFE):
            raise _bad(
                path,
                f"'{path}': {node[:40]!r} holds a double quote, which the "
                "engines' grammars cannot spell; use another character",
            )
