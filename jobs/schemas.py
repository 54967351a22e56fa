"""The JSON schemas Ballast admits in a ``response_format`` (docs/protocol-notes.md
"Output features"): the subset every engine that declares ``json_schema`` must
enforce by constrained decoding (llama.cpp's schema-to-grammar converter takes
all of it).

``schema_checked`` returns a schema's constraints (annotations dropped) or
raises ``ApiError(400)`` naming, by its JSON path, the first keyword outside
the subset: a keyword a grammar would ignore is refused before dispatch,
rather than accepted and ignored on a host (or failed there, counted against
an honest device); so is text no engine's grammar can hold
(``jobs.schematext``) and a ``$ref`` at the root.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import ApiError
from .schematext import (
    defs_renamed,
    json_text_checked,
    literals_checked,
    refs_grounded,
)

SCHEMA_MAX_BYTES = 32_768  # the schema as JSON
SCHEMA_MAX_NODES = 1_000  # subschemas, all told
SCHEMA_MAX_DEPTH = 32  # nesting of subschemas
SCHEMA_MAX_REPEAT = 256  # minLength/maxLength/minItems/maxItems
SCHEMA_MAX_MEMBERS = 64  # properties of one object, members of one anyOf/tuple
SCHEMA_MAX_ENUM = 256

# keywords that describe without constraining: dropped from what hosts receive
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "examples",
        "default",
        "$comment",
        "$schema",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
SIMPLE_TYPES = frozenset(
    {"object", "array", "string", "number", "integer", "boolean", "null"}
)
STRING_FORMATS = frozenset({"date", "time", "date-time", "uuid"})
# what each kind of subschema may hold besides annotations and $defs
_ALLOWED = {
    "object": {"type", "properties", "required", "additionalProperties"},
    "array": {"type", "items", "prefixItems", "minItems", "maxItems"},
    "string": {"type", "format", "minLength", "maxLength"},
    "number": {"type"},
    "integer": {"type"},
    "boolean": {"type"},
    "null": {"type"},
}
_DEFS = ("$defs", "definitions")
_PYTHON_TYPES = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "null": (type(None),),
    "object": (dict,),
    "array": (list,),
}


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, "invalid_request", param=param)


def schema_checked(schema: Any, *, param: str) -> dict:
    """``schema`` with its annotations dropped, once it is within the subset
    Ballast enforces; ApiError 400 naming the first keyword outside it (by its
    JSON path under ``param``).

    The subset (docs/protocol-notes.md "Output features"): ``type`` (one of
    object, array, string, number, integer, boolean, null, or a list of them
    alone), ``properties``, ``required`` (names among the properties),
    ``additionalProperties`` (a boolean or a schema), ``items`` (a schema, with
    ``minItems``/``maxItems``; or a list: a tuple), ``prefixItems``,
    ``minLength``/``maxLength`` or one ``format`` of date, time, date-time,
    uuid for strings, ``enum``, ``const``, ``anyOf``, ``$ref`` to
    ``#/$defs/...`` or ``#/definitions/...``; bounded in size.
    """
    try:
        size = len(json.dumps(schema, allow_nan=False).encode("utf-8"))
    except (TypeError, ValueError, RecursionError):
        raise _bad(param, f"'{param}' is not JSON") from None
    if size > SCHEMA_MAX_BYTES:
        raise _bad(param, f"'{param}' is over {SCHEMA_MAX_BYTES} bytes as JSON")
    if not isinstance(schema, dict):
        raise _bad(param, f"'{param}' must be an object")
    json_text_checked(schema, param)
    cleaned = _SchemaWalk(schema, param).node(schema, param, 0)
    refs_grounded(cleaned, param)
    if "$ref" in cleaned:  # (llama.cpp's converter fails on a recursive root $ref)
        raise _bad(
            f"{param}.$ref",
            f"'{param}.$ref' at the root is not supported: put the schema at the "
            "root and $ref its parts",
        )
    if not set(cleaned) - set(_DEFS):
        return {}  # any value: definitions nothing refers to (a converter refuses them alone)
    return defs_renamed(cleaned)


_NAME_MAPS = ("properties", "$defs", "definitions")
"""The keywords whose value maps names to schemas."""
_SCHEMA_PLACES = (*_NAME_MAPS, "items", "additionalProperties")
"""The keywords a ``$ref`` may go through from a schema to a schema (or a
map of them)."""


class _SchemaWalk:
    """One pass over a schema: checks each subschema, returns the cleaned copy."""

    def __init__(self, root: dict, param: str) -> None:
        self.root = root
        self.param = param
        self.nodes = 0

    def node(self, node: Any, path: str, depth: int) -> dict:
        if not isinstance(node, dict):
            raise _bad(path, f"'{path}' must be a schema object")
        self.nodes += 1
        if self.nodes > SCHEMA_MAX_NODES or depth > SCHEMA_MAX_DEPTH:
            raise _bad(
                self.param,
                f"'{self.param}' is too large (at most {SCHEMA_MAX_NODES} "
                f"subschemas, nested at most {SCHEMA_MAX_DEPTH} deep)",
            )
        out: dict[str, Any] = {}
        for key in _DEFS:
            if key in node:
                if depth:  # (a $ref points into the root's definitions only)
                    raise _bad(
                        f"{path}.{key}",
                        f"'{path}.{key}': definitions belong at the schema's root",
                    )
                defs = node[key]
                if not isinstance(defs, dict):
                    raise _bad(f"{path}.{key}", f"'{path}.{key}' must be an object")
                out[key] = {
                    name: self.node(sub, f"{path}.{key}.{name}", depth + 1)
                    for name, sub in defs.items()
                }
        rest = {
            k: v for k, v in node.items() if k not in ANNOTATIONS and k not in _DEFS
        }
        if "$ref" in rest:
            self._only(rest, {"$ref"}, path, "with '$ref'")
            out["$ref"] = self._ref(rest["$ref"], f"{path}.$ref")
        elif "anyOf" in rest:
            self._only(rest, {"anyOf"}, path, "with 'anyOf'")
            out["anyOf"] = self._members(rest["anyOf"], f"{path}.anyOf", depth)
        elif "const" in rest or "enum" in rest:
            out.update(self._values(rest, path))
        elif isinstance(rest.get("type"), list):
            out["type"] = self._type_list(rest, path)
        else:
            out.update(self._typed(rest, path, depth))
        return out

    def _only(self, node: dict, allowed: set[str], path: str, why: str) -> None:
        for key in node:
            if key not in allowed:
                raise _bad(
                    f"{path}.{key}", f"'{key}' is not supported in a json_schema {why}"
                )

    def _ref(self, ref: Any, path: str) -> str:
        if (
            not isinstance(ref, str)
            or not ref.startswith(("#/$defs/", "#/definitions/"))
            or "~" in ref
            or "%" in ref
        ):
            raise _bad(
                path, f"'{path}' must point into the schema's $defs ('#/$defs/Name')"
            )
        target: Any = self.root
        at_schema = True  # (else at a map of names to schemas: properties, $defs)
        for part in ref[2:].split("/"):
            if not isinstance(target, dict) or part not in target:
                raise _bad(path, f"'{path}' points to nothing in the schema: {ref}")
            if at_schema and part not in _SCHEMA_PLACES:
                raise _bad(path, f"'{path}' does not point to a schema: {ref}")
            at_schema = not at_schema or part not in _NAME_MAPS
            target = target[part]
        if not isinstance(target, dict) or not at_schema:
            # (a map of properties is a dict but no schema: llama.cpp's
            # converter fails on it, and every honest host with it)
            raise _bad(path, f"'{path}' does not point to a schema: {ref}")
        return ref

    def _members(self, members: Any, path: str, depth: int) -> list[dict]:
        if (
            not isinstance(members, list)
            or not members
            or len(members) > SCHEMA_MAX_MEMBERS
        ):
            raise _bad(
                path, f"'{path}' must list 1 to {SCHEMA_MAX_MEMBERS} schemas"
            )
        return [
            self.node(sub, f"{path}[{i}]", depth + 1) for i, sub in enumerate(members)
        ]

    def _values(self, node: dict, path: str) -> dict:
        """``const`` or ``enum`` (with an optional ``type`` every value has)."""
        self._only(node, {"const", "enum", "type"}, path, "with 'enum' or 'const'")
        if "const" in node and "enum" in node:
            raise _bad(f"{path}.enum", f"'{path}' has both 'const' and 'enum'")
        literals_checked(node.get("const"), f"{path}.const")
        literals_checked(node.get("enum"), f"{path}.enum")
        if "const" in node:
            values, out = [node["const"]], {"const": node["const"]}
        else:
            values = node["enum"]
            if not isinstance(values, list) or not 0 < len(values) <= SCHEMA_MAX_ENUM:
                raise _bad(
                    f"{path}.enum",
                    f"'{path}.enum' must list 1 to {SCHEMA_MAX_ENUM} values",
                )
            out = {"enum": values}
        kind = node.get("type")
        if kind is not None:
            if not isinstance(kind, str) or kind not in SIMPLE_TYPES:
                raise _bad(
                    f"{path}.type",
                    f"'{path}.type' beside 'enum' or 'const' must be one JSON type",
                )
            for value in values:
                if not _has_type(value, kind):
                    raise _bad(
                        f"{path}.type",
                        f"'{path}': the value {json.dumps(value)[:40]} is not of "
                        f"type {kind}",
                    )
        return out

    def _type_list(self, node: dict, path: str) -> list[str]:
        kinds = node["type"]
        if (
            not kinds
            or not all(isinstance(k, str) and k in SIMPLE_TYPES for k in kinds)
            or len(set(kinds)) != len(kinds)
        ):
            raise _bad(f"{path}.type", f"'{path}.type' must list distinct JSON types")
        self._only(
            node, {"type"}, path, "beside a list of types (use anyOf of schemas)"
        )
        return list(kinds)

    def _typed(self, node: dict, path: str, depth: int) -> dict:
        kind = node.get("type")
        if kind is None:
            if any(k in node for k in ("properties", "additionalProperties")):
                kind = "object"
            elif any(k in node for k in ("items", "prefixItems")):
                kind = "array"
            elif not node:
                return {}  # any value (a grammar gives an object: still valid)
            else:
                key = sorted(node)[0]
                raise _bad(
                    f"{path}.{key}",
                    f"'{key}' is not supported in a json_schema without a 'type'",
                )
        if not isinstance(kind, str) or kind not in _ALLOWED:
            raise _bad(f"{path}.type", f"'{path}.type' is not a JSON type")
        self._only(node, _ALLOWED[kind], path, f"of type {kind}")
        out: dict[str, Any] = {"type": kind}
        if kind == "object":
            out.update(self._object(node, path, depth))
        elif kind == "array":
            out.update(self._array(node, path, depth))
        elif kind == "string":
            out.update(self._string(node, path))
        return out

    def _object(self, node: dict, path: str, depth: int) -> dict:
        out: dict[str, Any] = {}
        props = node.get("properties", {})
        if not isinstance(props, dict) or len(props) > SCHEMA_MAX_MEMBERS:
            raise _bad(
                f"{path}.properties",
                f"'{path}.properties' must be an object of at most "
                f"{SCHEMA_MAX_MEMBERS} schemas",
            )
        literals_checked(dict.fromkeys(props), f"{path}.properties")
        if "" in props:
            raise _bad(f"{path}.properties", f"'{path}.properties' has an empty name")
        if "properties" in node:
            out["properties"] = {
                name: self.node(sub, f"{path}.properties.{name}", depth + 1)
                for name, sub in props.items()
            }
        if "required" in node:
            required = node["required"]
            if not isinstance(required, list) or not all(
                isinstance(n, str) for n in required
            ):
                raise _bad(
                    f"{path}.required", f"'{path}.required' must list property names"
                )
            missing = [n for n in required if n not in props]
            if missing:
                raise _bad(
                    f"{path}.required",
                    f"'{path}.required' names {missing[0]!r}, which is not among "
                    "its properties",
                )
            out["required"] = list(dict.fromkeys(required))
        if "additionalProperties" in node:
            extra = node["additionalProperties"]
            if isinstance(extra, bool):
                out["additionalProperties"] = extra
            else:
                out["additionalProperties"] = self.node(
                    extra, f"{path}.additionalProperties", depth + 1
                )
        return out

    def _array(self, node: dict, path: str, depth: int) -> dict:
        items = node.get("items")
        if "prefixItems" in node or isinstance(items, list):
            key = "prefixItems" if "prefixItems" in node else "items"
            if key == "prefixItems" and "items" in node:
                raise _bad(
                    f"{path}.items",
                    f"'{path}': 'items' beside 'prefixItems' is not supported",
                )
            self._only(node, {"type", key}, path, "of a tuple (prefixItems)")
            members = self._members(node[key], f"{path}.{key}", depth)
            return {"prefixItems": members}
        out: dict[str, Any] = {}
        if items is not None:
            cleaned = self.node(items, f"{path}.items", depth + 1)
            if cleaned:  # ({} is any item: said by no items, which converters take)
                out["items"] = cleaned
        elif "minItems" in node or "maxItems" in node:
            raise _bad(
                f"{path}.minItems" if "minItems" in node else f"{path}.maxItems",
                f"'{path}': minItems/maxItems need 'items'",
            )
        out.update(self._bounds(node, path, "minItems", "maxItems"))
        return out

    def _string(self, node: dict, path: str) -> dict:
        if "format" in node:
            self._only(node, {"type", "format"}, path, "with 'format'")
            if node["format"] not in STRING_FORMATS:
                raise _bad(
                    f"{path}.format",
                    f"'{path}.format' must be one of {sorted(STRING_FORMATS)}",
                )
            return {"format": node["format"]}
        return self._bounds(node, path, "minLength", "maxLength")

    def _bounds(self, node: dict, path: str, low: str, high: str) -> dict:
        out: dict[str, int] = {}
        for key in (low, high):
            if key in node:
                value = node[key]
                if (
                    isinstance(value, bool)
                    or not isinstance(value, int)
                    or not 0 <= value <= SCHEMA_MAX_REPEAT
                ):
                    raise _bad(
                        f"{path}.{key}",
                        f"'{path}.{key}' must be an integer from 0 to "
                        f"{SCHEMA_MAX_REPEAT}",
                    )
                out[key] = value
        if out.get(low, 0) > out.get(high, SCHEMA_MAX_REPEAT):
            raise _bad(f"{path}.{low}", f"'{path}.{low}' is above '{high}'")
        return out


def _has_type(value: Any, kind: str) -> bool:
    """Whether JSON ``value`` is of JSON Schema type ``kind`` (true is no number)."""
    if isinstance(value, bool):
        return kind == "boolean"
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _PYTHON_TYPES[kind])
