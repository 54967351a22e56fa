"""Agent frameworks' function calling, unmodified, against the real model on
real processes (issue 33 item 1; docs/tools.md): LangChain's ``bind_tools``
(``langchain-openai``, which sends ``tool_choice`` and ``parallel_tool_calls``
its own way) and litellm's ``completion`` with ``tools``, whole and streamed.
Each call's arguments parse and fit its function's schema."""

from __future__ import annotations

import json
import os

import pytest
from pydantic import BaseModel, Field

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # the network is closed
import litellm  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402

MODEL = "smollm2-135m-instruct"

pytestmark = pytest.mark.e2e


class GetWeather(BaseModel):
    """The current weather in a city."""

    city: str = Field(max_length=20)


@pytest.fixture
def e2e_env(e2e_env):
    e2e_env["BALLAST_SPOT_CHECKS"] = "0"
    # the functions' preamble is a few hundred tokens of prompt: its prefill
    # on a loaded CI machine can pass the 20 s default
    e2e_env["BALLAST_FIRST_TOKEN_TIMEOUT_S"] = "120"
    return e2e_env


@pytest.fixture
def served(stack, renter_key, machine) -> str:
    """The coordinator's /v1 URL, one real agent serving the model."""
    stack.start_agent("rig-1", machine("rig-1"))
    stack.wait_for_capacity(renter_key, MODEL)
    return stack.url + "/v1"


def test_langchain_bind_tools_gets_calls_it_parses(served, renter_key):
    chat = ChatOpenAI(
        model=MODEL,
        base_url=served,
        api_key=renter_key,
        temperature=0,
        max_tokens=120,
        max_retries=0,
    )
    ask = "What is the weather in Paris?"
    bound = chat.bind_tools([GetWeather], tool_choice="GetWeather")
    answer = bound.invoke(ask)
    assert isinstance(answer, AIMessage) and not answer.invalid_tool_calls
    (call,) = answer.tool_calls
    assert call["name"] == "GetWeather" and call["id"]
    GetWeather.model_validate(call["args"])

    streamed = None
    for chunk in bound.stream(ask):
        streamed = chunk if streamed is None else streamed + chunk
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [
        (call["name"], call["args"])
    ], "temperature 0: the stream assembles to the same call"

    # the call's result goes back; bind_tools' default lets the model answer
    after = chat.bind_tools([GetWeather]).invoke(
        [
            ("user", ask),
            answer,
            ToolMessage(content="Sunny, 21 C", tool_call_id=call["id"]),
        ]
    )
    assert after.content or after.tool_calls
    for later in after.tool_calls:
        GetWeather.model_validate(later["args"])


def test_litellm_completion_with_tools(served, renter_key):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "GetWeather",
                "description": "The current weather in a city.",
                "parameters": GetWeather.model_json_schema(),
            },
        }
    ]
    common = dict(
        model=f"openai/{MODEL}",
        api_base=served,
        api_key=renter_key,
        messages=[{"role": "user", "content": "What is the weather in Lyon?"}],
        tools=tools,
        tool_choice="required",
        temperature=0,
        max_tokens=120,
        num_retries=0,
    )
    whole = litellm.completion(**common)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls and all(c.function.name == "GetWeather" for c in calls)
    for call in calls:
        GetWeather.model_validate(json.loads(call.function.arguments))

    chunks = list(litellm.completion(**common, stream=True))
    rebuilt = litellm.stream_chunk_builder(chunks, messages=common["messages"])
    again = rebuilt.choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in again] == [
        (c.function.name, c.function.arguments) for c in calls
    ]
