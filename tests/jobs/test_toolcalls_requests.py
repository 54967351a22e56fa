"""A request's function calling as ``jobs.requests.completion_request_parse``
checks it (``jobs.toolcalls.requests``): OpenAI's ``tools``, ``tool_choice``,
``parallel_tool_calls`` and a conversation's calls and results, turned into
the constraint and the plain messages a host is sent; what is wrong is a 400
naming the field."""

from __future__ import annotations

import json

import pytest

from jobs.errors import ApiError
from jobs.formats import features_needed, response_format_of
from jobs.requests import completion_request_parse


def _tool(name: str = "get_weather", **parameters) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} of a city",
            "parameters": parameters
            or {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "a city"}},
                "required": ["city"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }


def _parse(messages=None, endpoint="chat", **fields):
    body = {"model": "m", **fields}
    if endpoint == "chat":
        body["messages"] = messages or [{"role": "user", "content": "Weather in Oslo?"}]
    else:
        body["prompt"] = "x"
    return completion_request_parse(body, endpoint=endpoint)


def _schema(parsed) -> dict:
    return response_format_of(parsed.params)["json_schema"]["schema"]


def test_tools_are_generated_under_the_formats_constraint():
    parsed = _parse(tools=[_tool(), _tool("get_time")])
    assert parsed.params["tool_format"] == "generic_json"
    assert features_needed(parsed.params) == ("json_schema",)
    prose, called = _schema(parsed)["anyOf"]  # auto: text or calls
    assert prose["required"] == ["content"]
    calls = called["properties"]["tool_calls"]
    assert "maxItems" not in calls, "parallel calls by default"
    members = calls["items"]["anyOf"]
    assert [m["properties"]["name"] for m in members] == [
        {"const": "get_weather"},
        {"const": "get_time"},
    ]
    arguments = members[0]["properties"]["arguments"]
    assert arguments["properties"]["city"] == {"type": "string"}, "annotations dropped"
    system, user = parsed.messages
    assert system["role"] == "system" and '"description": "a city"' in system["content"]
    assert user == {"role": "user", "content": "Weather in Oslo?"}


def test_required_named_and_single_calls_narrow_the_constraint():
    required = _schema(_parse(tools=[_tool()], tool_choice="required"))
    assert required["required"] == ["tool_calls"]
    named = _schema(
        _parse(
            tools=[_tool(), _tool("get_time")],
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )
    )
    calls = named["properties"]["tool_calls"]
    assert calls["items"]["properties"]["name"] == {"const": "get_time"}
    assert calls["maxItems"] == 1
    single = _schema(_parse(tools=[_tool()], parallel_tool_calls=False))
    assert single["anyOf"][1]["properties"]["tool_calls"]["maxItems"] == 1


def test_a_bare_object_schema_means_no_arguments():
    """``{"type": "object"}`` alone is an empty object (docs/tools.md), not any
    object: the converter read it as any (fresh-eyes review 3 of issue 33)."""
    parsed = _parse(tools=[_tool("now", type="object")], tool_choice="required")
    call = _schema(parsed)["properties"]["tool_calls"]["items"]
    assert call["properties"]["arguments"] == {"type": "object", "properties": {}}


def test_tool_choice_none_answers_plain_text():
    parsed = _parse(tools=[_tool()], tool_choice="none")
    assert "tool_format" not in parsed.params
    assert "response_format" not in parsed.params
    assert parsed.messages == [{"role": "user", "content": "Weather in Oslo?"}]


def test_a_conversation_with_calls_and_results_is_rendered_as_plain_turns():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Oslo"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"},
    ]
    parsed = _parse(messages, tools=[_tool()])
    system, user, assistant, result = parsed.messages
    assert system["content"].startswith("Be brief.\n\nYou can call these functions")
    assert [m["role"] for m in parsed.messages] == [
        "system",
        "user",
        "assistant",
        "user",
    ]
    assert json.loads(assistant["content"]) == {
        "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]
    }
    assert json.loads(result["content"]) == {
        "tool_result": {
            "name": "get_weather",
            "tool_call_id": "call_1",
            "content": "-3 C",
        }
    }


def test_nested_definitions_move_to_the_root():
    """A pydantic model with a nested one has ``$defs``; a ``$ref`` points
    from the root of the schema the host gets."""
    parameters = {
        "type": "object",
        "properties": {"place": {"$ref": "#/$defs/Place"}},
        "required": ["place"],
        "$defs": {
            "Place": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            }
        },
    }
    schema = _schema(
        _parse(tools=[_tool("locate", **parameters)], tool_choice="required")
    )
    arguments = schema["properties"]["tool_calls"]["items"]["properties"]["arguments"]
    # (hoisted as f0_Place, then renamed as grammars can name it: jobs.schematext)
    assert arguments["properties"]["place"] == {"$ref": "#/$defs/ballast-def-0"}
    assert schema["$defs"]["ballast-def-0"]["required"] == ["city"]


def test_a_ref_into_a_definitions_part_follows_it_to_the_root():
    """A ``$ref`` to a place inside a definition (``#/$defs/Place/properties/
    city``) is rewritten with its definition, and a ``const`` that holds a
    ``$defs`` key is a value, left as it is (both were a 400 naming the
    coordinator's own path)."""
    parameters = {
        "type": "object",
        "properties": {
            "city": {"$ref": "#/$defs/Place/properties/city"},
            "mode": {"const": {"$defs": {"x": 1}}},
        },
        "required": ["city", "mode"],
        "$defs": {
            "Place": {"type": "object", "properties": {"city": {"type": "string"}}}
        },
    }
    for choice in ("required", "auto"):
        schema = _schema(_parse(tools=[_tool("locate", **parameters)], tool_choice=choice))
        calls = schema["properties"]["tool_calls"] if choice == "required" else (
            schema["anyOf"][1]["properties"]["tool_calls"]
        )
        arguments = calls["items"]["properties"]["arguments"]["properties"]
        assert arguments["city"] == {"$ref": "#/$defs/ballast-def-0/properties/city"}
        assert arguments["mode"] == {"const": {"$defs": {"x": 1}}}
        assert schema["$defs"]["ballast-def-0"]["properties"]["city"] == {"type": "string"}


def test_the_constraint_has_a_grammar():
    """The reference engine turns it into GBNF (llama-cpp-python's converter)."""
    from agent.engines.constrained import grammar_of

    parsed = _parse(tools=[_tool(), _tool("get_time")])
    assert "tool_calls" in grammar_of(response_format_of(parsed.params))


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tools": "yes"}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools[0].function.name",
        ),
        (
            {
                "tools": [
                    _tool(
                        type="object",
                        properties={"n": {"type": "integer", "minimum": 1}},
                    )
                ]
            },
            "tools[0].function.parameters.properties.n.minimum",
        ),
        ({"tools": [_tool(type="string")]}, "tools[0].function.parameters"),
        ({"tools": [_tool()], "tool_choice": "sometimes"}, "tool_choice"),
        (
            {
                "tools": [_tool()],
                "tool_choice": {"type": "function", "function": {"name": "x"}},
            },
            "tool_choice.function.name",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [_tool()], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
        (
            {"tools": [_tool()], "response_format": {"type": "json_object"}},
            "response_format",
        ),
        ({"tools": [_tool()], "logprobs": True}, "logprobs"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "description": "a\x00"},
                    }
                ]
            },
            "tools",
        ),
    ],
)
def test_what_is_wrong_is_a_400_naming_it(fields, param):
    with pytest.raises(ApiError) as refused:
        _parse(**fields)
    assert (refused.value.status, refused.value.param) == (400, param)


def test_tools_are_chat_only():
    with pytest.raises(ApiError) as refused:
        _parse(endpoint="completion", tools=[_tool()])
    assert refused.value.param == "tools"


@pytest.mark.parametrize(
    "message, param",
    [
        (
            {
                "role": "user",
                "content": "x",
                "tool_calls": [{"function": {"name": "f"}}],
            },
            "messages[0].tool_calls",
        ),
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "f", "arguments": {}}}],
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            {"role": "tool", "content": "x", "tool_call_id": 3},
            "messages[0].tool_call_id",
        ),
        ({"role": "assistant", "content": None}, "messages[0].content"),
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "f", "arguments": "\ud800"}}],
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}],
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        ({"role": "tool", "content": "x"}, "messages[0].tool_call_id"),
        (
            {"role": "tool", "content": "x", "tool_call_id": "zzz"},
            "messages[0].tool_call_id",
        ),
        (
            {"role": "tool", "content": "x", "tool_call_id": "\ud800"},
            "messages[0].tool_call_id",
        ),
    ],
)
def test_a_bad_call_or_result_in_the_conversation_is_a_400(message, param):
    with pytest.raises(ApiError) as refused:
        _parse([message])
    assert (refused.value.status, refused.value.param) == (400, param)


def test_two_tools_of_one_name_are_a_400_naming_the_second():
    tool = {"type": "function", "function": {"name": "f"}}
    with pytest.raises(ApiError) as refused:
        _parse([{"role": "user", "content": "x"}], tools=[tool, tool])
    assert refused.value.param == "tools[1].function.name"
