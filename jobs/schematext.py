"""What text a request's JSON may hold where it reaches a host's engine:
storable text everywhere (``json_text_checked``), and in the literals a
grammar spells out of a schema (property names, ``enum`` and ``const``
values) only what every engine's grammar can hold (``literals_checked``);
the names a grammar gives its rules (``defs_renamed``) and the references
it can build (``refs_grounded``: no left recursion).

Found by driving the reference agent (llama.cpp's schema-to-grammar
converter and its grammar parser): a ``"`` in such a literal makes a grammar
llama.cpp refuses, and a NUL one its decoder drops, so the host fails the
job — counted against an honest device — unless it is refused here first.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .errors import ApiError

GRAMMAR_UNSAFE = '"\\'
"""Characters no literal of a schema may hold: llama.cpp's converter writes
them unescaped into the grammar, which its parser then refuses (a double
quote) or reads as another escape (a backslash: the output is no JSON). Nor
may a control character (the grammar lets it out raw: no JSON either) nor
one past U+FFFF (written as a surrogate pair, generated as U+FFFD)."""


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, "invalid_request", param=param)


def _strings(value: Any) -> Iterator[str]:
    """Every string of JSON ``value``, object keys included."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str):
            yield node


def json_text_checked(value: Any, param: str) -> None:
    """ApiError 400 unless every string in JSON ``value`` (keys too) is
    storable text: valid UTF-8 (no lone surrogate), no NUL."""
    for text in _strings(value):
        if "\x00" in text:
            raise _bad(param, f"'{param}' must not contain NUL characters")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _bad(param, f"'{param}' is not valid UTF-8 text") from None


def literals_checked(value: Any, path: str) -> None:
    """ApiError 400 naming ``path`` when a string of ``value`` (an object
    keyed by the property names, or an ``enum``/``const`` value, keys and
    members included) holds a character of ``GRAMMAR_UNSAFE``, a control
    character or one past U+FFFF, or when an object of it has the key
    ``$ref`` (grammar converters, llama.cpp's too, read every ``$ref`` key
    as a reference: the host's engine fails the job)."""
    if _ref_keyed(value):
        raise _bad(
            path,
            f"'{path}': '$ref' as a property name or a key inside a value is not "
            "supported (the engines' schema converters read it as a reference)",
        )
    for text in _strings(value):
        if any(_unsafe(c) for c in text):
            raise _bad(
                path,
                f"'{path}': {text[:40]!r} holds a double quote, a backslash, a "
                "control character or one past U+FFFF, which the engines' "
                "grammars cannot spell; use another character",
            )


def _ref_keyed(value: Any) -> bool:
    """Whether an object in JSON ``value`` has the key ``$ref``."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "$ref" in node:
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _unsafe(char: str) -> bool:
    code = ord(char)
    return char in GRAMMAR_UNSAFE or code < 0x20 or code == 0x7F or code > 0xFFFF


DEFS = ("$defs", "definitions")
DEF_NAME = "ballast-def-{}"
"""What the schema's root definitions are renamed to before hosts see them:
llama.cpp's converter names grammar rules after them, and a name outside
``[A-Za-z0-9-]`` broke a recursive reference's rule (``my_node``, ``a.b``,
pydantic's ``Page_int_``), one like a rule of its own (``space``,
``string``) took that rule's place."""


def refs_moved(node: Any, moves: dict[str, str]) -> Any:
    """A copy of (checked) subschema ``node`` with every ``$ref`` that names
    a definition in ``moves`` (``{"#/$defs/A": "#/$defs/B"}``), or a place
    inside one (``#/$defs/A/properties/city``), pointing to its new place.
    Only schema places are walked: an ``enum`` or ``const`` value is copied
    as it is."""
    if not isinstance(node, dict):
        return node  # (true/false of additionalProperties)
    out = dict(node)
    ref = node.get("$ref")
    if isinstance(ref, str):
        for old, new in moves.items():
            if ref == old or ref.startswith(old + "/"):
                out["$ref"] = new + ref[len(old) :]
                break
    for key in ("items", "additionalProperties"):
        if key in node:
            out[key] = refs_moved(node[key], moves)
    for key in ("anyOf", "prefixItems"):
        if key in node:
            out[key] = [refs_moved(sub, moves) for sub in node[key]]
    for key in ("properties", *DEFS):
        if key in node:
            out[key] = {name: refs_moved(sub, moves) for name, sub in node[key].items()}
    return out


def defs_renamed(schema: dict) -> dict:
    """``schema`` (checked, its refs pointing into its root ``$defs`` or
    ``definitions``) with each root definition renamed ``DEF_NAME`` (in
    order) and every ``$ref`` to it rewritten; what it means is unchanged."""
    moves: dict[str, str] = {}
    for key in DEFS:
        for name in schema.get(key, {}):
            moves[f"#/{key}/{name}"] = f"#/{key}/{DEF_NAME.format(len(moves))}"
    renamed = refs_moved(schema, moves)
    for key in DEFS:
        if key in renamed:
            renamed[key] = {
                moves[f"#/{key}/{name}"].rsplit("/", 1)[1]: sub
                for name, sub in renamed[key].items()
            }
    return renamed


def refs_grounded(root: dict, param: str) -> None:
    """ApiError 400 when a ``$ref`` reaches itself through ``$ref`` and
    ``anyOf`` alone, before any object or array opens: a grammar rule that
    begins with itself (left recursion), which grammar engines refuse to build.
    Recursion inside an object or array (a tree of nodes) is fine."""

    def target(ref: str) -> dict:
        node: Any = root
        for part in ref[2:].split("/"):
            node = node[part]
        return node

    def heads(node: dict) -> list[str]:
        """The refs a value of ``node`` may begin with."""
        if "$ref" in node:
            return [node["$ref"]]
        return [ref for sub in node.get("anyOf", ()) for ref in heads(sub)]

    done: set[str] = set()

    def visit(ref: str, path: tuple[str, ...]) -> None:
        if ref in path:
            raise _bad(
                param,
                f"'{param}': {ref} refers to itself before any object or array "
                "opens (left recursion)",
            )
        if ref in done:
            return
        for nxt in heads(target(ref)):
            visit(nxt, (*path, ref))
        done.add(ref)

    def every(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                visit(node["$ref"], ())
            for value in node.values():
                every(value)
        elif isinstance(node, list):
            for value in node:
                every(value)

    every(root)
