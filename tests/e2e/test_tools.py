"""Function calling end to end on real processes (docs/tools.md): the
coordinator, agents running SmolLM2-135M-Instruct through llama.cpp, and the
official ``openai`` client unmodified: ``tool_calls`` whole and streamed, its
``chat.completions.stream`` helper assembling and parsing calls, a
conversation holding calls and results; and a host killed mid-call (in the
arguments, in a name, between two calls) continued exactly on the real model
under the advanced constraint."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field

MODEL = "smollm2-135m-instruct"

pytestmark = pytest.mark.e2e


class GetWeather(BaseModel):
    """The current weather in a city."""

    city: str = Field(max_length=20)


class GetTime(BaseModel):
    """The local time in a city."""

    city: str = Field(max_length=20)
    hours24: bool


TOOLS = [
    openai.pydantic_function_tool(GetWeather),
    openai.pydantic_function_tool(GetTime),
]
ARGUMENTS = {"GetWeather": GetWeather, "GetTime": GetTime}


@pytest.fixture
def e2e_env(e2e_env):
    # the scripted first host stalls until the test kills it; no spot check
    # may reach its scripted device meanwhile
    e2e_env["BALLAST_STALL_TIMEOUT_S"] = "120"
    e2e_env["BALLAST_SPOT_CHECKS"] = "0"
    # the functions' preamble is a few hundred tokens of prompt: on a shared,
    # loaded CI machine its prefill alone can pass the 20 s default
    e2e_env["BALLAST_FIRST_TOKEN_TIMEOUT_S"] = "120"
    return e2e_env


def _fits(call) -> None:
    """A call names a tool and its arguments parse and fit its schema."""
    ARGUMENTS[call.function.name].model_validate_json(call.function.arguments)


def _assembled(chunks) -> tuple[dict[int, dict], str | None, str]:
    """Calls assembled from ``delta.tool_calls`` by index (checking a call's
    first piece has id, type and name), the finish reason, the content."""
    calls: dict[int, dict] = {}
    finish, content = None, ""
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for piece in choice.delta.tool_calls or []:
            assert piece.index is not None
            if piece.index not in calls:
                assert piece.id and piece.type == "function" and piece.function.name
                calls[piece.index] = {
                    "id": piece.id,
                    "name": piece.function.name,
                    "arguments": "",
                }
            else:
                assert piece.id is None and piece.function.name is None
            calls[piece.index]["arguments"] += piece.function.arguments or ""
        finish = choice.finish_reason or finish
    return calls, finish, content


def test_the_sdk_gets_tool_calls_whole_streamed_and_parsed(stack, renter_key, machine):
    stack.start_agent("rig-1", machine("rig-1"))
    stack.wait_for_capacity(renter_key, MODEL)
    client = OpenAI(base_url=stack.url + "/v1", api_key=renter_key, max_retries=0)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]

    whole = client.chat.completions.create(
        model=MODEL,
        messages=ask,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=120,
    )
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        _fits(call)

    stream = client.chat.completions.create(
        model=MODEL,
        messages=ask,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=120,
        stream=True,
    )
    calls, finish, _ = _assembled(stream)
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls
    ], "temperature 0: the stream assembles to the whole answer's calls"

    named = {"type": "function", "function": {"name": "GetTime"}}
    with client.chat.completions.stream(
        model=MODEL,
        messages=ask,
        tools=TOOLS,
        tool_choice=named,
        temperature=0,
        max_tokens=120,
    ) as helper:
        final = helper.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "GetTime"
    assert isinstance(call.function.parsed_arguments, GetTime)

    # the call and its result go back; auto lets the model answer in text or call
    after = client.chat.completions.create(
        model=MODEL,
        messages=[
            *ask,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [c.model_dump() for c in choice.message.tool_calls],
            },
            *(
                {"role": "tool", "tool_call_id": c.id, "content": "Sunny, 21 C"}
                for c in choice.message.tool_calls
            ),
        ],
        tools=TOOLS,
        temperature=0,
        max_tokens=120,
    )
    message = after.choices[0].message
    assert after.choices[0].finish_reason in ("stop", "tool_calls")
    assert message.content or message.tool_calls
    for call in message.tool_calls or []:
        _fits(call)

    none = client.chat.completions.create(
        model=MODEL,
        messages=ask,
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=16,
    )
    assert none.choices[0].message.content and not none.choices[0].message.tool_calls


CUTS = {
    "mid-arguments": '{"tool_calls": [{"name": "GetWeather", "arguments": {"city": "Ly',
    "mid-name": (
        '{"tool_calls": [{"name": "GetWeather", "arguments": {"city": "Lyon"}}, '
        '{"name": "GetTi'
    ),
    "between-calls": '{"tool_calls": [{"name": "GetWeather", "arguments": {"city": "Lyon"}}, ',
}


@pytest.mark.parametrize("cut", list(CUTS))
def test_a_call_cut_by_a_dead_host_is_continued_exactly(
    cut, stack, renter_key, machine
):
    """The first host (a scripted agent) streams the start of the calls and
    stalls; it is SIGKILLed; the continuation runs on the real model from the
    delivered prefix under the same constraint: the renter's assembled calls
    parse and fit their schemas, the first one as the dead host began it."""
    prefix = CUTS[cut]
    script = {
        "pieces": [prefix],
        "mode": "stall_at",
        "n": 1,
        "features": ["json_schema"],
    }
    stack.start_agent(
        "rig-dies",
        machine("rig-dies"),
        "--engine",
        "scripted",
        "--script",
        json.dumps(script),
    )
    stack.wait_for_capacity(renter_key, MODEL)
    client = OpenAI(base_url=stack.url + "/v1", api_key=renter_key, max_retries=0)
    chunks: list = []
    begun = threading.Event()
    outcome: dict = {}

    def renter() -> None:
        raw = client.chat.completions.with_streaming_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather and time in Lyon?"}],
            tools=TOOLS,
            tool_choice="required",
            temperature=0,
            max_tokens=160,
            stream=True,
        )
        with raw as response:
            outcome["job"] = response.headers["x-ballast-job-id"]
            for chunk in response.parse():
                chunks.append(chunk)
                calls, _, _ = _assembled(chunks)
                if calls and calls[0]["arguments"].startswith('{"city": "Ly'):
                    begun.set()

    reader = threading.Thread(target=renter)
    reader.start()
    assert begun.wait(60), f"the prefix never came: {chunks}"
    stack.start_agent("rig-real", machine("rig-real"))
    stack.wait_for_capacity(renter_key, MODEL, devices=2)
    stack.kill("rig-dies")
    reader.join(240)
    assert not reader.is_alive()

    calls, finish, content = _assembled(chunks)
    assert finish == "tool_calls" and content == ""
    assert list(calls) == list(range(len(calls))), "indexes in order, none lost"
    assert len({c["id"] for c in calls.values()}) == len(calls), "no call repeated"
    first = GetWeather.model_validate_json(calls[0]["arguments"])
    assert first.city.startswith("Ly")
    for call in calls.values():
        ARGUMENTS[call["name"]].model_validate_json(call["arguments"])
    if cut != "mid-arguments":
        assert calls[0]["arguments"] == '{"city": "Lyon"}'
        assert len(calls) >= 2
    if cut == "mid-name":
        assert calls[1]["name"] == "GetTime"
    job = httpx.get(
        f"{stack.url}/v1/jobs/{outcome['job']}",
        headers={"Authorization": f"Bearer {renter_key}"},
    ).json()
    assert job["failed_over"] is True and job["status"] == "succeeded"
    assert [(a["kind"], a["outcome"]) for a in job["attempts"]] == [
        ("fresh", "died_midstream"),
        ("continuation", "succeeded"),
    ]
    assert job["attempts"][1]["device"].startswith("rig-real/")
    assert job["tokens_billed"] == sum(a["tokens_billed"] for a in job["attempts"])
