"""The generic JSON tool-call format's parser (``jobs.toolcalls``): a host's
text, in any split, becomes the same content and calls, streamed as the text
arrives (a call's name whole in its first piece, its arguments in order) and
whole (``message.tool_calls``, ``finish_reason: "tool_calls"``)."""

from __future__ import annotations

import json

import pytest

from jobs.toolcalls.answers import ToolAnswer
from jobs.toolcalls.generic import CallParser
from jobs.toolcalls.scanner import JsonScanner, ScanError

CALLS = (
    '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Pa\\u00e9ris \\"x\\"",'
    ' "days": 12, "hourly": [true, null, -1.5e3], "nested": {"a": {}}}},'
    '\n {"name":"now","arguments":{}}]}'
)


def _split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _streamed(text: str, size: int) -> tuple[ToolAnswer, list[dict]]:
    answer = ToolAnswer("generic_json")
    deltas = []
    for piece in _split(text, size):
        deltas.extend(answer.deltas(piece))
    return answer, deltas


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, len(CALLS)])
def test_it_streams_the_same_calls_whatever_the_split(size):
    answer, deltas = _streamed(CALLS, size)
    calls: dict[int, dict] = {}
    for delta in deltas:
        assert set(delta) == {"tool_calls"}
        (piece,) = delta["tool_calls"]
        index = piece["index"]
        if index not in calls:  # a call's first piece: id, type and whole name
            assert piece["id"].startswith("call_") and piece["type"] == "function"
            calls[index] = {"id": piece["id"], **piece["function"]}
        else:
            assert set(piece) == {"index", "function"}
            assert set(piece["function"]) == {"arguments"}
            calls[index]["arguments"] += piece["function"]["arguments"]
    assert [c["name"] for c in calls.values()] == ["get_weather", "now"]
    first = json.loads(calls[0]["arguments"])
    assert first == {
        "city": 'Paéris "x"',
        "days": 12,
        "hourly": [True, None, -1500.0],
        "nested": {"a": {}},
    }
    assert json.loads(calls[1]["arguments"]) == {}
    message = answer.message()
    assert message["content"] is None
    assert [
        (c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in message["tool_calls"]
    ] == [(c["id"], c["name"], c["arguments"]) for c in calls.values()]
    assert answer.finish_reason("stop") == "tool_calls"
    assert answer.finish_reason("length") == "length"


@pytest.mark.parametrize("size", [1, 4, 100])
def test_prose_is_streamed_as_content_with_its_escapes_decoded(size):
    text = '{"content": "Hi \\"you\\"\\n\\ud83d\\ude00 \\u00e9\\\\"}'
    answer, deltas = _streamed(text, size)
    assert "".join(d["content"] for d in deltas) == 'Hi "you"\n😀 é\\'
    assert answer.message() == {
        "role": "assistant",
        "content": 'Hi "you"\n😀 é\\',
        "refusal": None,
    }
    assert answer.finish_reason("stop") == "stop"


def test_arguments_written_before_the_name_follow_its_first_piece():
    answer = ToolAnswer("generic_json")
    deltas = answer.deltas('{"tool_calls": [{"arguments": {"a": 1}, "name": "f"}]}')
    assert deltas[0]["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    assert deltas[1]["tool_calls"][0]["function"] == {"arguments": '{"a": 1}'}


def test_nothing_is_sent_while_a_name_is_being_written():
    answer = ToolAnswer("generic_json")
    assert answer.deltas('{"tool_calls": [{"name": "get_wea') == []
    first, begun = answer.deltas('ther", "arguments": {"ci')
    assert first["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": "",
    }
    # the arguments begun in the same piece come after the call's first piece
    assert begun == {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}
    assert answer.deltas('ty": 1}}]}') == [
        {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": 1}'}}]}
    ]
    assert answer.message()["tool_calls"][0]["function"]["arguments"] == '{"city": 1}'


def test_a_number_ending_the_arguments_is_kept_whole():
    """A number's end is known only at the next character."""
    answer, _ = _streamed('{"tool_calls": [{"name": "f", "arguments": {"n": 42}}]}', 1)
    assert answer.message()["tool_calls"][0]["function"]["arguments"] == '{"n": 42}'


def test_text_that_leaves_the_format_is_delivered_as_content():
    """A host that ignored the constraint: nothing it delivered is dropped."""
    parser = CallParser()
    assert parser.feed("Sure! ") == [("content", "Sure! ")]
    assert parser.feed("{x") == [("content", "{x")]
    parser = CallParser()  # the structure around a string is not content
    assert parser.feed('{"content": "a", x') == [("content", "ax")]
    assert parser.feed('"}') == [("content", '"}')]


def test_a_call_cut_by_a_stop_sequence_does_not_finish_as_tool_calls():
    answer, _ = _streamed('{"tool_calls": [{"name": "f", "arguments": {"a": 1}}', 4)
    assert answer.called and answer.finish_reason("stop") == "stop"
    answer.deltas("]}")
    assert answer.finish_reason("stop") == "tool_calls"


def test_an_answer_cut_mid_arguments_keeps_what_came():
    answer, _ = _streamed('{"tool_calls": [{"name": "f", "arguments": {"city": "Ly', 3)
    message = answer.message()
    assert message["tool_calls"][0]["function"]["arguments"] == '{"city": "Ly'
    assert answer.finish_reason("length") == "length"


@pytest.mark.parametrize(
    "text",
    ['{"a" 1}', '{"a": tru}', '{"a": "\\x"}', '["a",]x', '{"a": "\\udc00"}', "{} {}"],
)
def test_the_scanner_refuses_what_is_not_json(text):
    scanner = JsonScanner(
        on_string=lambda path, text: None,
        raw_wanted=lambda path: False,
        on_raw=lambda path, text: None,
        on_value_end=lambda path: None,
    )
    with pytest.raises(ScanError):
        scanner.feed(text)
        scanner.feed(" ")
