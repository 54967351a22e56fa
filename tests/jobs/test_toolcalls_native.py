"""Models' own tool-call formats (``jobs.toolcalls.native`` and
``sequence``): Hermes/Qwen 2.5's ``<tool_call>`` blocks and Llama 3.1's bare
``{"name", "parameters"}`` object give, in any split of the host's text, the
same content and calls as the generic format's parser gives (a call's name
whole in its first piece, its arguments in order); text outside the format is
content, never a crash; the constraint each format is generated under."""

from __future__ import annotations

import json

import pytest

from jobs.toolcalls.answers import ToolAnswer
from jobs.toolcalls.generic import Choice, Function
from jobs.toolcalls.native import LAYOUTS, constraint

ARGUMENTS = (
    '{"city": "Pa\\u00e9ris \\"x\\" </tool_call>", "days": 12,'
    ' "hourly": [true, null, -1.5e3], "nested": {"name": {}}}'
)
HERMES = (
    '<tool_call>\n{"name": "get_weather", "arguments": '
    + ARGUMENTS
    + "} \n</tool_call>\n"
    '<tool_call>\n{"name":"now","arguments":{}}\n</tool_call>'
)
LLAMA3 = '{"name": "get_weather", "parameters": ' + ARGUMENTS + "} "
WHOLE = {"hermes": HERMES, "llama3": LLAMA3}
NAMES = {"hermes": ["get_weather", "now"], "llama3": ["get_weather"]}


def _assembled(format: str, pieces: list[str]) -> tuple[ToolAnswer, dict, str]:
    """Feed ``pieces`` and assemble the streamed deltas as a client does:
    (the answer, its calls by index, its content)."""
    answer = ToolAnswer(format)
    deltas = [d for piece in pieces for d in answer.deltas(piece)] + answer.end()
    calls: dict[int, dict] = {}
    content = ""
    for delta in deltas:
        if "content" in delta:
            content += delta["content"]
            continue
        (piece,) = delta["tool_calls"]
        index = piece["index"]
        if index not in calls:  # a call's first piece: id, type and whole name
            assert piece["id"].startswith("call_") and piece["type"] == "function"
            assert piece["function"]["arguments"] == ""
            calls[index] = {"id": piece["id"], **piece["function"]}
        else:
            assert set(piece) == {"index", "function"}
            calls[index]["arguments"] += piece["function"]["arguments"]
    return answer, calls, content


@pytest.mark.parametrize("format", ["hermes", "llama3"])
def test_it_assembles_the_same_calls_split_at_every_position(format):
    text = WHOLE[format]
    expected = None
    for cut in range(len(text) + 1):
        for pieces in ([text[:cut], text[cut:]], [text[:cut], *text[cut:]]):
            answer, calls, content = _assembled(format, pieces)
            got = [(c["name"], json.loads(c["arguments"])) for c in calls.values()]
            assert content == "", (cut, content)
            assert [n for n, _ in got] == NAMES[format]
            expected = expected or got
            assert got == expected, cut
            assert answer.finish_reason("stop") == "tool_calls"
    assert expected[0][1]["city"] == 'Paéris "x" </tool_call>'
    message = _assembled(format, [text])[0].message()
    assert message["content"] is None
    assert [c["function"]["name"] for c in message["tool_calls"]] == NAMES[format]


@pytest.mark.parametrize(
    "format, text",
    [
        ("hermes", "The weather is sunny."),
        ("hermes", "<tool_cal> is not a call"),
        ("hermes", "<tool"),  # held back while it may begin a call: given at the end
        ("llama3", "Paris is {sunny}"),
        ("llama3", ""),
    ],
)
def test_it_gives_text_that_begins_otherwise_as_content(format, text):
    for cut in range(len(text) + 1):
        answer, calls, content = _assembled(format, [text[:cut], text[cut:]])
        assert (calls, content) == ({}, text)
        assert answer.finish_reason("stop") == "stop"
        assert answer.message()["content"] == text


@pytest.mark.parametrize(
    "format, text, called, rest",
    [
        ("hermes", '<tool_call>\n{"name": 5}', [], "}"),
        ("hermes", '<tool_call>\n["x"]', [], '["x"]'),
        (
            "hermes",
            '<tool_call>\n{"name": "now", "arguments": {}}\n<x>',
            ["now"],
            "\n<x>",
        ),
        (
            "hermes",
            '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\nok',
            ["now"],
            "\nok",
        ),
        ("llama3", '{"name": "now", "parameters": {}} and more', ["now"], "and more"),
        (
            "llama3",
            '{"name": "now", "parameters": {}}{"name": "now"}',
            ["now"],
            '{"name": "now"}',
        ),
        ("llama3", '{"name": {"a": "b"}}', [], "}}"),
        ("llama3", '{"parameters": {}}', [], "}"),
        ("llama3", '{"name": "now", "parameters": {"a": tru}}', ["now"], "}}"),
    ],
)
def test_it_turns_malformed_text_into_content_not_a_crash(format, text, called, rest):
    for cut in range(len(text) + 1):
        answer, calls, content = _assembled(format, [text[:cut], text[cut:]])
        assert [c["name"] for c in calls.values()] == called
        assert content == rest
        assert answer.finish_reason("stop") == "stop"  # not a whole answer
        answer.message()


def test_it_keeps_a_cut_answer_cut():
    answer, calls, content = _assembled("hermes", [HERMES[:60]])
    assert [c["name"] for c in calls.values()] == ["get_weather"]
    assert answer.finish_reason("length") == "length"
    assert answer.finish_reason("stop") == "stop"


@pytest.mark.parametrize("cut", ["\n<too", "\n", "\n<tool_call>\n"])
def test_a_literal_cut_short_after_a_call_is_no_content(cut):
    """``max_tokens`` or a ``stop`` ending the answer inside the format's own
    text after a call (the next call's prefix, the suffix) leaves no format
    text in ``content`` (fresh-eyes review 3: ``"\n<too"`` was content beside
    the calls)."""
    end = HERMES.index("\n</tool_call>") + len("\n</tool_call>")  # the first call's
    first = HERMES[:end]
    answer, calls, content = _assembled("hermes", [first + cut])
    assert [c["name"] for c in calls.values()] == ["get_weather"]
    assert content == ""
    suffix_cut = HERMES[: end - 5]  # inside the suffix
    answer, calls, content = _assembled("hermes", [suffix_cut])
    assert [c["name"] for c in calls.values()] == ["get_weather"] and content == ""


FUNCTIONS = [
    Function(
        "get_weather",
        "",
        {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
        {},
    ),
    Function("now", "", {"type": "object", "properties": {}}, {}),
]


def _call(name: str, key: str) -> dict:
    parameters = next(f.parameters for f in FUNCTIONS if f.name == name)
    return {
        "type": "object",
        "properties": {"name": {"const": name}, key: parameters},
        "required": ["name", key],
        "additionalProperties": False,
    }


def test_it_constrains_llama3_named_and_required_calls_by_a_json_schema():
    """One bare JSON object: any engine declaring ``json_schema`` serves it."""
    named = constraint(FUNCTIONS, Choice("named", name="now"), LAYOUTS["llama3"])
    assert named == {
        "type": "json_schema",
        "json_schema": {
            "name": "tool_calls",
            "schema": _call("now", "parameters"),
            "strict": True,
        },
    }
    required = constraint(FUNCTIONS, Choice("required"), LAYOUTS["llama3"])
    assert required["json_schema"]["schema"] == {
        "anyOf": [_call("get_weather", "parameters"), _call("now", "parameters")]
    }
    auto = constraint(FUNCTIONS, Choice("auto"), LAYOUTS["llama3"])
    assert auto["type"] == "json_sequence"
    assert auto["json_sequence"]["max_items"] == 1
    assert auto["json_sequence"]["text_unless"] == "{"


def test_it_constrains_hermes_calls_by_a_json_sequence():
    required = constraint(FUNCTIONS, Choice("required"), LAYOUTS["hermes"])
    assert required == {
        "type": "json_sequence",
        "json_sequence": {
            "name": "tool_calls",
            "schema": {
                "anyOf": [_call("get_weather", "arguments"), _call("now", "arguments")]
            },
            "prefix": "<tool_call>\n",
            "suffix": "\n</tool_call>",
            "separator": "\n",
            "min_items": 1,
        },
    }
    single = constraint(FUNCTIONS, Choice("auto", parallel=False), LAYOUTS["hermes"])
    assert single["json_sequence"]["max_items"] == 1
    assert single["json_sequence"]["text_unless"] == "<tool_call>\n"
    named = constraint(
        FUNCTIONS, Choice("named", name="get_weather"), LAYOUTS["hermes"]
    )
    assert named["json_sequence"]["schema"] == _call("get_weather", "arguments")
    assert named["json_sequence"]["max_items"] == 1
