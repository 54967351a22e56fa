"""``response_format`` and ``logprobs`` admitted (docs/protocol-notes.md "Output
features"): within the subset engines enforce, the schema kept as the engine
needs it, anything else a 400 naming the field. The real model's side is
tests/agent/test_constrained.py and tests/e2e/test_structured_output.py."""

from __future__ import annotations

import json

import pytest

from jobs.errors import ApiError
from jobs.requests import completion_request_parse
from tests.hostsim import MODEL

from .output_features import JSON_SCHEMA, chat_parse, response_format_kept


def _refused(endpoint="chat", **fields) -> ApiError:
    body = {"model": MODEL, **fields}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "x"}]
    else:
        body["prompt"] = "x"
    with pytest.raises(ApiError) as refused:
        completion_request_parse(body, endpoint=endpoint)
    assert refused.value.status == 400
    return refused.value


def test_a_json_object_is_kept_as_asked():
    assert response_format_kept(response_format={"type": "json_object"}) == {"type": "json_object"}


def test_a_json_schema_goes_to_hosts_without_its_annotations():
    assert response_format_kept(response_format=JSON_SCHEMA) == {
        "type": "json_schema",
        "json_schema": {
            "name": "answer",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "population": {"type": "integer"},
                },
                "required": ["city", "population"],
                "additionalProperties": False,
            },
        },
    }


def test_a_plain_request_keeps_its_params_as_they_were():
    params = chat_parse(response_format={"type": "text"}, logprobs=False).params
    assert set(params) == {"max_tokens", "temperature", "top_p", "stop", "seed"}


def test_a_pydantic_models_schema_is_admitted():
    """What ``client.chat.completions.parse(response_format=Model)`` sends:
    $defs and $ref, enums, optional fields (anyOf with null), lists."""
    from enum import Enum

    from pydantic import BaseModel, Field

    class Colour(str, Enum):
        RED = "red"
        BLUE = "blue"

    class Item(BaseModel):
        name: str = Field(max_length=12)
        colour: Colour

    class Order(BaseModel):
        items: list[Item] = Field(max_length=3)
        note: str | None = None
        paid: bool

    schema = Order.model_json_schema()
    spec = {"name": "Order", "schema": schema, "strict": True}
    kept = response_format_kept(response_format={"type": "json_schema", "json_schema": spec})
    sent = kept["json_schema"]["schema"]
    # definitions renamed as grammars can name their rules (jobs.schematext)
    colour, item = (f"ballast-def-{i}" for i in range(2))
    assert list(schema["$defs"]) == ["Colour", "Item"] and set(sent["$defs"]) == {colour, item}
    assert sent["$defs"][item]["properties"]["colour"] == {"$ref": f"#/$defs/{colour}"}
    assert sent["properties"]["items"]["items"] == {"$ref": f"#/$defs/{item}"}
    assert "title" not in json.dumps(sent)


@pytest.mark.parametrize(
    "schema, param",
    [
        ({"type": "string", "pattern": "^a+$"}, "schema.pattern"),
        ({"type": "integer", "minimum": 0}, "schema.minimum"),
        ({"type": "string", "format": "email"}, "schema.format"),
        ({"oneOf": [{"type": "string"}]}, "schema.oneOf"),
        ({"allOf": [{"type": "string"}]}, "schema.allOf"),
        ({"not": {"type": "string"}}, "schema.not"),
        ({"type": "array", "uniqueItems": True}, "schema.uniqueItems"),
        ({"type": "array", "minItems": 2}, "schema.minItems"),
        (
            {"type": "array", "items": {"type": "string"}, "minItems": 300},
            "schema.minItems",
        ),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "schema.minLength"),
        ({"type": ["string", "null"], "maxLength": 3}, "schema.maxLength"),
        ({"enum": [1, "a"], "type": "string"}, "schema.type"),
        (
            {"type": "object", "properties": {"a": {}}, "required": ["b"]},
            "schema.required",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "integer", "maximum": 3}}},
            "schema.properties.a.maximum",
        ),
        ({"$ref": "https://example.com/s.json"}, "schema.$ref"),
        ({"$ref": "#/$defs/Missing"}, "schema.$ref"),
        ({"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/A"}}}, "schema"),
        (
            {"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}},
             "$ref": "#/$defs/A"},
            "schema",
        ),
        ({"type": "object", "minProperties": 1}, "schema.minProperties"),
        ([{"type": "string"}], "schema"),
    ],
)
def test_a_schema_keyword_no_grammar_enforces_is_a_400_naming_it(schema, param):
    """Never accepted and ignored: a keyword outside the subset every engine
    with ``json_schema`` enforces is refused before dispatch, by its path."""
    spec = {"name": "s", "schema": schema}
    error = _refused(response_format={"type": "json_schema", "json_schema": spec})
    assert error.param == f"response_format.json_schema.{param}", error.message


def test_a_schema_that_refers_to_itself_inside_an_object_is_admitted():
    """Recursion that opens an object first (a tree) has a grammar."""
    node = {
        "type": "object",
        "properties": {
            "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}
        },
    }
    tree = {
        "$defs": {"Node": node},
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/Node"}},
    }
    spec = {"name": "tree", "schema": tree}
    assert chat_parse(response_format={"type": "json_schema", "json_schema": spec})
    # the same tree as a $ref at the root: llama.cpp's converter fails on it
    rooted = {"$defs": {"Node": node}, "$ref": "#/$defs/Node"}
    with pytest.raises(ApiError) as refused:
        chat_parse(response_format=_spec({"name": "tree", "schema": rooted}))
    assert refused.value.param == "response_format.json_schema.schema.$ref"


@pytest.mark.parametrize(
    "schema, param",
    [
        (
            {"type": "object", "properties": {'a"b': {"type": "integer"}}},
            "response_format.json_schema.schema.properties",
        ),
        ({"enum": ["x", 'say "hi"']}, "response_format.json_schema.schema.enum"),
        ({"const": {"k": 'a"'}}, "response_format.json_schema.schema.const"),
        ({"enum": ["a\u0000b"]}, "response_format.json_schema.schema"),
        ({"const": "\ud800"}, "response_format.json_schema.schema"),
        (
            {"type": "object", "properties": {"$ref": {"type": "string"}}},
            "response_format.json_schema.schema.properties",
        ),
        ({"const": {"$ref": "x"}}, "response_format.json_schema.schema.const"),
        ({"enum": [{"$ref": "#/$defs/zz"}]}, "response_format.json_schema.schema.enum"),
        (  # a map of properties is no schema (every honest host failed on it)
            {
                "type": "object",
                "properties": {"c": {"$ref": "#/$defs/A/properties"}},
                "$defs": {"A": {"type": "object", "properties": {"n": {"type": "string"}}}},
            },
            "response_format.json_schema.schema.properties.c.$ref",
        ),
    ],
)
def test_text_no_grammar_can_hold_is_a_400_naming_where(schema, param):
    """What the reference agent failed on (an honest device blamed, the
    renter served a fragment): a double quote in a literal the grammar spells,
    a NUL, a lone surrogate, ``$ref`` as a property name (llama.cpp's
    converter read it as a reference); and ``$ref`` inside a ``const`` or
    ``enum`` value (a 500 before: read as a reference to nothing)."""
    with pytest.raises(ApiError) as refused:
        chat_parse(response_format=_spec({"name": "t", "schema": schema}))
    assert refused.value.status == 400 and refused.value.param == param


def _spec(json_schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": json_schema}


@pytest.mark.parametrize(
    "response_format, param",
    [
        ("json", "response_format"),
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        (_spec({"schema": {}}), "response_format.json_schema.name"),
        (_spec({"name": "a b", "schema": {}}), "response_format.json_schema.name"),
        (_spec({"name": "a"}), "response_format.json_schema.schema"),
        ({"type": "json_object", "json_schema": {}}, "response_format.json_schema"),
        (_spec({"name": "a", "schema": {}, "x": 1}), "response_format.json_schema.x"),
    ],
)
def test_a_bad_response_format_is_a_400_naming_the_field(response_format, param):
    assert _refused(response_format=response_format).param == param


def test_response_format_is_for_chat_only():
    error = _refused("completion", response_format={"type": "json_object"})
    assert error.param == "response_format"


@pytest.mark.parametrize(
    "fields, wanted",
    [
        ({"logprobs": True}, 0),
        ({"logprobs": True, "top_logprobs": 3}, 3),
        ({"logprobs": True, "top_logprobs": 20}, 20),
        ({"logprobs": False, "top_logprobs": 0}, None),  # clients' defaults
        ({"logprobs": None}, None),
    ],
)
def test_chat_logprobs_become_the_alternatives_wanted(fields, wanted):
    assert chat_parse(**fields).params.get("logprobs") == wanted


@pytest.mark.parametrize(
    "endpoint, fields, param",
    [
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ("chat", {"logprobs": 1}, "logprobs"),
        ("completion", {"logprobs": 21}, "logprobs"),
        ("completion", {"logprobs": "3"}, "logprobs"),
        ("completion", {"logprobs": 2, "top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_bad_logprobs_are_a_400_naming_the_field(endpoint, fields, param):
    assert _refused(endpoint, **fields).param == param


def test_completions_take_logprobs_as_the_number_of_alternatives():
    parsed = completion_request_parse(
        {"model": MODEL, "prompt": "x", "logprobs": 5}, endpoint="completion"
    )
    assert parsed.params["logprobs"] == 5


def test_every_schema_form_the_engine_tests_enforce_is_admitted():
    """tests/agent/test_constrained.py runs ``ADMITTED`` on the real model:
    the coordinator admits each of them as it is (no annotations to drop;
    its definitions renamed as grammars can name them, ``jobs.schematext``)."""
    from jobs.schemas import schema_checked
    from jobs.schematext import defs_renamed
    from tests.agent.test_constrained import ADMITTED

    for form, schema in ADMITTED.items():
        assert schema_checked(schema, param="schema") == defs_renamed(schema), form


@pytest.mark.parametrize("kind", [{}, [], 1, True])
def test_a_schema_type_that_is_not_a_name_is_a_400_not_a_500(kind):
    """Found by the schemathesis run (tests/fuzz): ``{"type": {}}`` raised a
    TypeError (a 500) looking the value up among the JSON types."""
    schema = {"type": kind}
    refused = _refused(
        response_format={
            "type": "json_schema",
            "json_schema": {
                "name": "x",
                "schema": {"type": "object", "properties": {"a": schema}},
            },
        }
    )
    assert refused.param.startswith("response_format.json_schema.schema")
