"""A conversation with tools for a model whose catalog entry has a native
tool-call format is rendered by the model's own chat template (the real
templates of Qwen 2.5 and Llama 3.1, as llama.cpp's tests keep them), which
shows the functions and writes earlier calls and results itself; what the
template writes of a call is what the format's parser reads back; the job is
sent that prompt and the format's constraint (``jobs.requests.request_for_model``).
"""

from __future__ import annotations

import json

import pytest

from jobs.errors import ApiError
from jobs.formats import response_format_of
from jobs.requests import completion_request_parse, request_for_model
from jobs.toolcalls.answers import ToolAnswer
from modeldata.template import ChatTemplate
from tests.modeldata.vectors import VectorsUnavailable, template_read

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "Its name"}},
            "required": ["city"],
        },
    },
}
NOW = {
    "type": "function",
    "function": {"name": "now", "parameters": {"type": "object", "properties": {}}},
}


def _template(name: str, bos: str, eos: str) -> ChatTemplate:
    try:
        return ChatTemplate(template_read(name), bos_token=bos, eos_token=eos)
    except VectorsUnavailable as exc:
        pytest.skip(f"llama.cpp's templates cannot be downloaded: {exc}")


@pytest.fixture(scope="module")
def qwen() -> ChatTemplate:
    return _template("Qwen-Qwen2.5-7B-Instruct", "", "<|im_end|>")


@pytest.fixture(scope="module")
def llama31() -> ChatTemplate:
    return _template(
        "meta-llama-Llama-3.1-8B-Instruct", "<|begin_of_text|>", "<|eot_id|>"
    )


def _call(id: str, name: str, arguments: dict) -> dict:
    return {
        "id": id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _bound(body: dict, format: str, template: ChatTemplate | None):
    parsed = completion_request_parse({"model": "m", **body}, endpoint="chat")
    return parsed, request_for_model(parsed, tool_call_format=format, template=template)


def _assembled(format: str, text: str) -> list[tuple[str, dict]]:
    answer = ToolAnswer(format)
    answer.deltas(text)
    answer.end()
    message = answer.message()
    assert message["content"] is None, message
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message["tool_calls"]
    ]


def test_it_renders_hermes_calls_and_results_by_qwens_template(qwen):
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris, and the time?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    _call("c1", "get_weather", {"city": "Paris"}),
                    _call("c2", "now", {}),
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": "12:00"},
        ],
        "tools": [WEATHER, NOW],
        "tool_choice": "required",
    }
    _, bound = _bound(body, "hermes", qwen)
    assert bound.messages is None
    prompt = bound.prompt
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert (
        "<tools>\n" + json.dumps(WEATHER) + "\n" + json.dumps(NOW) + "\n</tools>"
        in prompt
    )
    turn = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    )
    assert f"<|im_start|>assistant\n{turn}<|im_end|>\n" in prompt
    assert (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\n12:00\n</tool_response><|im_end|>\n"
    ) in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    # what the template writes of calls is what the parser reads
    assert _assembled("hermes", turn) == [
        ("get_weather", {"city": "Paris"}),
        ("now", {}),
    ]
    assert bound.params["tool_format"] == "hermes"
    constraint = response_format_of(bound.params)
    assert constraint["type"] == "json_sequence"
    assert constraint["json_sequence"]["prefix"] == "<tool_call>\n"


def test_it_renders_llama3_calls_and_results_by_llama31s_template(llama31):
    body = {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("c1", "get_weather", {"city": "Paris"})],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    _, bound = _bound(body, "llama3", llama31)
    prompt = bound.prompt
    assert prompt.startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Environment: ipython\n"
    )
    shown = (
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, "
        "please respond with a JSON for a function call with its proper arguments "
        'that best answers the given prompt.\n\nRespond in the format {"name": '
        'function name, "parameters": dictionary of argument name and its value}.'
        "Do not use variables.\n\n" + json.dumps(WEATHER, indent=4) + "\n\n"
        "Weather in Paris?<|eot_id|>"
    )
    assert shown in prompt
    turn = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert (
        f"<|start_header_id|>assistant<|end_header_id|>\n\n{turn}<|eot_id|>" in prompt
    )
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"sunny"<|eot_id|>' in prompt
    assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert _assembled("llama3", turn) == [("get_weather", {"city": "Paris"})]
    assert bound.params["tool_format"] == "llama3"
    assert response_format_of(bound.params)["type"] == "json_schema"


def test_it_shows_no_functions_under_tool_choice_none(llama31):
    body = {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("c1", "get_weather", {"city": "Paris"})],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        "tools": [WEATHER],
        "tool_choice": "none",
    }
    _, bound = _bound(body, "llama3", llama31)
    assert "Given the following functions" not in bound.prompt
    assert (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'
        in bound.prompt
    )
    assert "tool_format" not in bound.params and "response_format" not in bound.params


def test_it_refuses_what_the_template_refuses(llama31):
    body = {
        "messages": [
            {"role": "user", "content": "Weather in Paris and Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    _call("c1", "get_weather", {"city": "Paris"}),
                    _call("c2", "get_weather", {"city": "Oslo"}),
                ],
            },
        ],
        "tools": [WEATHER],
    }
    with pytest.raises(ApiError) as refused:
        _bound(body, "llama3", llama31)
    assert refused.value.status == 400 and refused.value.param == "messages"
    assert "only supports single tool-calls" in str(refused.value)


@pytest.mark.parametrize("format", ["", "mistral", "other"])
def test_it_keeps_the_generic_format_for_other_models(qwen, format):
    body = {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER],
    }
    parsed, bound = _bound(body, format, qwen)
    assert bound is parsed and bound.params["tool_format"] == "generic_json"


def test_it_keeps_the_generic_format_without_the_models_template():
    body = {"messages": [{"role": "user", "content": "Hi"}], "tools": [WEATHER]}
    parsed, bound = _bound(body, "hermes", None)
    assert bound is parsed


def test_it_leaves_a_conversation_without_tools_to_the_host(qwen):
    parsed, bound = _bound(
        {"messages": [{"role": "user", "content": "Hi"}]}, "hermes", qwen
    )
    assert bound is parsed and bound.messages == [{"role": "user", "content": "Hi"}]
