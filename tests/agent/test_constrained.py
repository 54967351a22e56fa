"""``response_format`` and ``logprobs`` on the real model (SmolLM2-135M-Instruct,
llama.cpp in process, no mocks): every kind of schema the coordinator admits
is enforced (the output validates against it), also across a continuation
from any cut of an answer, and the tokens' log-probabilities cover the text
exactly. The coordinator's side is tests/jobs/test_output_features_*.py, whose
admission tests check that it admits every schema of ``ADMITTED``."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest

from agent.engines.base import GenerationError, GenerationRequest, GenerationResult

MODEL = "smollm2-135m-instruct"
PROMPT = "Describe a city as JSON."

# one schema of each form the coordinator admits (jobs.formats.schema_checked)
ADMITTED: dict[str, dict[str, Any]] = {
    "object": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "people": {"type": "integer"},
            "area": {"type": "number"},
            "capital": {"type": "boolean"},
            "mayor": {"type": "null"},
        },
        "required": ["name", "people", "area", "capital", "mayor"],
        "additionalProperties": False,
    },
    "optional and extra": {
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 2, "maxLength": 8}},
        "additionalProperties": {"type": "integer"},
    },
    "array": {
        "type": "object",
        "properties": {
            "streets": {
                "type": "array",
                "items": {"type": "string", "maxLength": 10},
                "minItems": 2,
                "maxItems": 3,
            }
        },
        "required": ["streets"],
        "additionalProperties": False,
    },
    "tuple": {
        "type": "array",
        "prefixItems": [{"type": "string", "maxLength": 8}, {"type": "integer"}],
    },
    "enum and const": {
        "type": "object",
        "properties": {
            "size": {"enum": ["small", "large", 3]},
            "kind": {"const": "city"},
        },
        "required": ["size", "kind"],
        "additionalProperties": False,
    },
    "anyOf and type list": {
        "type": "object",
        "properties": {
            "people": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "code": {"type": ["string", "boolean"]},
        },
        "required": ["people", "code"],
        "additionalProperties": False,
    },
    "formats": {
        "type": "object",
        "properties": {
            "founded": {"type": "string", "format": "date"},
            "opens": {"type": "string", "format": "time"},
            "seen": {"type": "string", "format": "date-time"},
            "id": {"type": "string", "format": "uuid"},
        },
        "required": ["founded", "opens", "seen", "id"],
        "additionalProperties": False,
    },
    "$defs and $ref": {
        "$defs": {
            "Place": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 12}},
                "required": ["name"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"city": {"$ref": "#/$defs/Place"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}

CITY = ADMITTED["object"]


def json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


async def generate(
    engine: Any, **fields: Any
) -> tuple[str, list[str], GenerationResult]:
    params = {"temperature": 0, "max_tokens": 160} | fields.pop("params", {})
    request = GenerationRequest(
        model=MODEL,
        messages=[{"role": "user", "content": fields.pop("content", PROMPT)}],
        params=params,
        **fields,
    )
    result = GenerationResult()
    pieces = [piece async for piece in engine.stream(request, result)]
    return "".join(pieces), pieces, result


# the shapes llama.cpp's grammar gives each format (a calendar's rules, such
# as February's length, are not a grammar's: JSON Schema's formats annotate)
FORMAT_SHAPES = {
    "date": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "time": r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{3})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)",
    "uuid": r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}",
}
FORMAT_SHAPES["date-time"] = FORMAT_SHAPES["date"] + "T" + FORMAT_SHAPES["time"]


def validated(text: str, schema: dict[str, Any]) -> Any:
    """``text`` parsed, after checking it against ``schema`` and its strings
    against the shape of their ``format``."""
    value = json.loads(text)
    checker = jsonschema.FormatChecker(formats=())
    for name, shape in FORMAT_SHAPES.items():
        checker.checks(name)(lambda v, shape=shape: re.fullmatch(shape, v) is not None)
    jsonschema.validate(value, schema, format_checker=checker)
    return value


@pytest.mark.asyncio
@pytest.mark.parametrize("form", list(ADMITTED))
async def test_every_admitted_schema_form_is_enforced(llama_engine, form) -> None:
    schema = ADMITTED[form]
    sampled = [{"temperature": 0.9, "seed": 7}] if form == "object" else []
    for params in [{"temperature": 0}, *sampled]:
        text, _, result = await generate(
            llama_engine, response_format=json_schema(schema), params=params
        )
        if form == "optional and extra" and result.finish_reason == "length":
            # SmolLM2 may list extra properties until max_tokens: every one it
            # completed must match (the object closed after the last of them)
            text = text[: text.rindex(', "')] + "}"
        else:
            assert result.finish_reason == "stop", f"{form}: unfinished {text!r}"
        validated(text, schema)


@pytest.mark.asyncio
async def test_a_json_object_is_any_object(llama_engine) -> None:
    text, _, result = await generate(
        llama_engine,
        response_format={"type": "json_object"},
        params={"max_tokens": 200},
    )
    assert result.finish_reason == "stop"
    assert isinstance(json.loads(text), dict)


@pytest.mark.asyncio
async def test_a_continuation_from_any_cut_still_matches_the_schema(
    llama_engine,
) -> None:
    """Cut inside a key, after a colon, inside a string, inside a number, and
    one character before the end: prefix and continuation together parse and
    validate (the grammar is advanced over the delivered prefix)."""
    answer, _, _ = await generate(llama_engine, response_format=json_schema(CITY))
    validated(answer, CITY)
    cuts = {
        "in a key": answer.index('"name"') + 3,
        "after a colon": answer.index(":") + 1,
        "in a string": answer.index(":", answer.index('"name"')) + 4,
        "in a number": answer.index('"people"') + len('"people": ') + 1,
        "before the end": len(answer) - 1,
    }
    for where, cut in cuts.items():
        prefix = answer[:cut]
        rest, _, result = await generate(
            llama_engine, response_format=json_schema(CITY), continue_from=prefix
        )
        assert result.finish_reason == "stop", f"{where}: unfinished {rest!r}"
        validated(prefix + rest, CITY)


@pytest.mark.asyncio
async def test_a_continuation_of_text_the_model_did_not_write_matches_too(
    llama_engine,
) -> None:
    prefix = '{"name": "Ulan Bat'
    rest, _, _ = await generate(
        llama_engine, response_format=json_schema(CITY), continue_from=prefix
    )
    assert validated(prefix + rest, CITY)["name"].startswith("Ulan Bat")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "prefix", ["[", '{"nom', '{"name": 3', '{"name": "Ulan\nBat', '{"name": "Ulan\x01']
)
async def test_a_prefix_the_schema_does_not_allow_is_refused(
    llama_engine, prefix
) -> None:
    """Never a continuation that cannot parse: the engine says why instead
    (a raw control character in a string is no JSON: the grammar's string
    characters are JSON's, ``constrained.json_strict``)."""
    with pytest.raises(GenerationError, match="continue_from"):
        await generate(
            llama_engine, response_format=json_schema(CITY), continue_from=prefix
        )


@pytest.mark.asyncio
@pytest.mark.parametrize("top", [0, 3])
async def test_logprobs_cover_the_text_token_by_token(llama_engine, top) -> None:
    text, pieces, result = await generate(
        llama_engine, content="What is 2+2?", logprobs=top
    )
    entries = [entry for piece in pieces for entry in piece.logprobs]
    assert b"".join(bytes(e["bytes"]) for e in entries) == text.encode()
    assert len(entries) == result.completion_tokens
    for entry in entries:
        assert -9999 <= entry["logprob"] <= 0
        assert len(entry["top_logprobs"]) == top
        alternatives = [alt["logprob"] for alt in entry["top_logprobs"]]
        assert alternatives == sorted(alternatives, reverse=True)
        if top:  # temperature 0, no constraint: the likeliest token is chosen
            assert entry["top_logprobs"][0]["token"] == entry["token"]
            assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]


@pytest.mark.asyncio
async def test_logprobs_stop_with_the_text_at_a_stop_sequence(llama_engine) -> None:
    full, _, _ = await generate(llama_engine, content="What is 2+2?", logprobs=1)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    text, pieces, result = await generate(
        llama_engine, content="What is 2+2?", logprobs=1, params={"stop": [stop]}
    )
    assert stop not in text and result.finish_reason == "stop"
    entries = [entry for piece in pieces for entry in piece.logprobs]
    assert b"".join(bytes(e["bytes"]) for e in entries) == text.encode()


@pytest.mark.asyncio
async def test_logprobs_and_a_schema_across_a_healed_continuation(
    llama_engine,
) -> None:
    """Cut mid-word, the engine re-generates the cut token (token healing):
    its entry holds only the new bytes, so the entries still cover the text."""
    answer, _, _ = await generate(llama_engine, response_format=json_schema(CITY))
    prefix = answer[: answer.index(":", answer.index('"name"')) + 4]
    rest, pieces, _ = await generate(
        llama_engine,
        response_format=json_schema(CITY),
        continue_from=prefix,
        logprobs=2,
    )
    validated(prefix + rest, CITY)
    entries = [entry for piece in pieces for entry in piece.logprobs]
    assert b"".join(bytes(e["bytes"]) for e in entries) == rest.encode()
