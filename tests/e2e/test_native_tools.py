"""Function calling in a model's own tool-call format, on real processes
(issue 33 item 2): a tiny model of random weights (``tests/models/build.py``)
with Llama 3.1's real chat template on Llama 3's tokenizer, or Qwen 2.5's on
Qwen 2's, is added to the catalog, which finds its format (``llama3``,
``hermes``); a real agent serves it in llama.cpp.
The coordinator renders the functions by the model's own template and sends
the format's constraint; under ``tool_choice`` required or named, the
renter gets OpenAI ``tool_calls`` whose arguments parse and fit the schema,
whole and streamed: random weights write them only because of the grammar.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from openai import OpenAI

from ballast.stack import manage
from tests.modeldata.vectors import VectorsUnavailable
from tests.models.build import tiny_llama31, tiny_qwen25

from .env import children_rows

# model id, its file, its format, what its template shows the functions in
MODELS = {
    "llama3": ("tiny-llama31", tiny_llama31, "Given the following functions"),
    "hermes": ("tiny-qwen25", tiny_qwen25, "<tools>\n"),
}
PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "unit": {"enum": ["C", "F"]},
        "days": {"type": "integer"},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": PARAMETERS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["UTC", "CET"]}},
                "required": ["zone"],
            },
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

pytestmark = pytest.mark.e2e


@pytest.fixture
def e2e_env(e2e_env):
    e2e_env["BALLAST_SPOT_CHECKS"] = "0"
    e2e_env["BALLAST_CLAIM_TIMEOUT_S"] = "60"
    e2e_env["BALLAST_FIRST_TOKEN_TIMEOUT_S"] = "120"
    e2e_env["BALLAST_STALL_TIMEOUT_S"] = "120"
    return e2e_env


def _built(build) -> Path:
    try:
        return build()
    except VectorsUnavailable as exc:
        pytest.skip(f"llama.cpp's vocabulary files cannot be downloaded: {exc}")


def _fits(name: str, arguments: str) -> dict:
    value = json.loads(arguments)
    schema = next(
        t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name
    )
    jsonschema.validate(value, schema)
    return value


@pytest.mark.parametrize("format", list(MODELS))
def test_a_model_calls_in_its_own_format(stack, renter_key, machine, format):
    model, build, shown = MODELS[format]
    tiny_file = _built(build)
    added = manage(
        "catalog_add", str(tiny_file), "--id", model,
        "--price-in", "0.1", "--price-out", "0.1",
        env=stack.env,
    )  # fmt: skip
    assert f"tool calls: {format}" in added
    stack.start_agent(
        "agent-tiny", machine("rig-tiny"),
        "--model", model, "--model-path", str(tiny_file),
    )  # fmt: skip
    stack.wait_for_capacity(renter_key, model, timeout_s=180)
    client = OpenAI(base_url=stack.url + "/v1", api_key=renter_key, max_retries=0)
    asked = {
        "model": model,
        "messages": ASK,
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 100,
        "parallel_tool_calls": False,
    }

    whole = client.chat.completions.create(**asked, tool_choice="required")
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    _fits(call.function.name, call.function.arguments)

    named = {"type": "function", "function": {"name": "get_weather"}}
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(
        **asked, tool_choice=named, stream=True
    ):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        assert not delta.content, delta
        for piece in delta.tool_calls or ():
            if piece.index not in calls:
                assert piece.id and piece.function.name == "get_weather"
                calls[piece.index] = {"name": piece.function.name, "arguments": ""}
            calls[piece.index]["arguments"] += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert list(calls) == [0]
    assert _fits("get_weather", calls[0]["arguments"])["unit"] in ("C", "F")

    # the host was sent the prompt the model's own template renders, the
    # functions shown where it shows them, and the format's constraint
    rows = children_rows(
        stack.env,
        f"SELECT prompt, params FROM jobs_job WHERE model_id = '{model}' ORDER BY created_at",
    )
    assert rows and all(shown in prompt for prompt, _ in rows)
    params = [json.loads(p) if isinstance(p, str) else p for _, p in rows]
    assert [p["tool_format"] for p in params] == [format, format]
