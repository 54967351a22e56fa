"""An honest host is never blamed for what a renter asked (DESIGN.md "Fair to
honest hosts"; issue 32 item 1), as a property over generated renter requests.

Real processes: the coordinator and two agents of two owners running
SmolLM2-135M-Instruct through llama.cpp (so answers are verified by the other
one, ``BALLAST_VERIFY_RATE``). Hypothesis draws every legal combination of
``response_format`` (schemas of each shape the grammar takes), ``tools`` (each
``tool_choice``), ``logprobs``, ``stop``, ``max_tokens`` down to 1,
temperatures 0–2, ``top_p``, ``seed``,
streamed or not, chat or raw prompts holding the model's special tokens and
its end-of-turn text, multi-byte text. Every request must be answered, and
afterwards neither device has a failed outcome, a flagged count, an
implausible verdict against it or a score under where it started.
(``bench/honest.py`` runs the same property longer.)
"""

from __future__ import annotations

import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from .env import children_rows

MODEL = "smollm2-135m-instruct"
# requests: 300 in CI (issue 32 item 1: at least 300); bench/honest.py asks more
EXAMPLES = int(os.environ.get("BALLAST_HONEST_REQUESTS", "300"))

pytestmark = pytest.mark.e2e

END_OF_TURN = "<|im_end|>"
TEXTS = [
    "What is 2+2?",
    "Write one short sentence about the sea.",
    "Réponds en français : quelle est la capitale de l'Italie ?",
    "日本語で一文だけ書いてください。",
    "Reply with emoji only 😀🎉",
    "Say <|im_end|> and then stop.",
    "<|im_start|>assistant\nHello",
    "List three colours:\n1.",
    "Describe a city as JSON.",
    "\u00a0\t  spaces\n\n\nand newlines  ",
]
RAW_PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "1, 2, 3, 4,",
    "日本の首都は",
    f"<|im_start|>user\nHi{END_OF_TURN}\n<|im_start|>assistant\nHello!{END_OF_TURN}",
    f"Goodbye.{END_OF_TURN}",
    f"<|im_start|>user\nSay nothing.{END_OF_TURN}\n<|im_start|>assistant\n{END_OF_TURN}",
    "def add(a, b):\n    return",
]
SCHEMAS = [
    {"type": "object"},
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "n": {"type": "number"}},
        "required": ["color", "n"],
    },
    {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}}, "ok": {"type": "boolean"}},
        "required": ["tags", "ok"],
    },
    {
        "type": "object",
        "properties": {
            "city": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 12}},
                "required": ["name"],
            }
        },
        "required": ["city"],
    },
    {
        "type": "object",
        "properties": {"d": {"type": "string", "format": "date"}, "x": {"type": "string", "maxLength": 5}},
        "required": ["d", "x"],
    },
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}},
]
TOOLS = [  # function calling (docs/tools.md): the generic format's constraint
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather in a city", "parameters": SCHEMAS[4]},
    },
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
]
TOOL_CHOICES = ["auto", "required", "none", {"type": "function", "function": {"name": "now"}}]
STOPS = ["\n", "e", " the", ".", "}", '"', "😀", "。", END_OF_TURN]


def _optional(strategy):
    return st.none() | strategy


@st.composite
def renter_requests(draw) -> tuple[str, dict]:
    """(path, body) of a legal renter request."""
    body: dict = {
        "model": MODEL,
        "max_tokens": draw(st.integers(1, 16)),
        "temperature": draw(_optional(st.sampled_from([0, 0.2, 0.7, 1.0, 1.3, 1.7, 2.0]))),
        "top_p": draw(_optional(st.sampled_from([0.05, 0.5, 0.9, 1.0]))),
        "seed": draw(_optional(st.integers(0, 2**40))),
        "stop": draw(_optional(st.lists(st.sampled_from(STOPS), min_size=1, max_size=3, unique=True))),
        "stream": draw(st.booleans()),
    }
    if draw(st.booleans()):
        messages = [{"role": "user", "content": draw(st.sampled_from(TEXTS))}]
        if draw(st.booleans()):
            messages.insert(0, {"role": "system", "content": draw(st.sampled_from(TEXTS))})
        body["messages"] = messages
        if draw(st.booleans()):
            body["logprobs"] = True
            body["top_logprobs"] = draw(st.integers(0, 3))
        shape = draw(st.sampled_from(["text", "json_object", "json_schema", "tools"]))
        if shape == "tools":
            body["tools"] = TOOLS
            body["tool_choice"] = draw(st.sampled_from(TOOL_CHOICES))
            body["parallel_tool_calls"] = draw(_optional(st.booleans()))
            body.pop("logprobs", None)  # not with tools (a 400)
            body.pop("top_logprobs", None)
        elif shape == "json_object":
            body["response_format"] = {"type": "json_object"}
        elif shape == "json_schema":
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": draw(st.sampled_from(SCHEMAS))},
            }
        return "/v1/chat/completions", {k: v for k, v in body.items() if v is not None}
    body["prompt"] = draw(st.sampled_from(RAW_PROMPTS + TEXTS))
    body["logprobs"] = draw(_optional(st.integers(0, 3)))
    return "/v1/completions", {k: v for k, v in body.items() if v is not None}


@pytest.fixture
def e2e_env(e2e_env):
    e2e_env["BALLAST_SPOT_CHECKS"] = "0"  # the renters' jobs and their verifications
    e2e_env["BALLAST_VERIFY_RATE"] = os.environ.get("BALLAST_HONEST_VERIFY_RATE", "0.25")
    e2e_env["BALLAST_EMPTY_ANSWER_RATE"] = "100000/hour"  # the renter's limit: not here
    return e2e_env


def _answered(response: httpx.Response, stream: bool) -> str:
    """The answer's text; fails on any error status or error chunk."""
    assert response.status_code == 200, response.text
    if not stream:
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] in ("stop", "length", "tool_calls"), choice
        return choice.get("text") or (choice.get("message") or {}).get("content") or ""
    text = ""
    for block in response.text.split("\n\n"):
        if not block.startswith("data: ") or block == "data: [DONE]":
            continue
        chunk = json.loads(block[len("data: ") :])
        assert "error" not in chunk, chunk
        for choice in chunk.get("choices", []):
            assert choice.get("finish_reason") in (None, "stop", "length", "tool_calls"), choice
            text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return text


def test_no_renter_request_blames_an_honest_host(stack, renter_key, machine_of):
    stack.start_agent("rig-a", machine_of("host-a@example.com", "rig-a"))
    stack.start_agent("rig-b", machine_of("host-b@example.com", "rig-b"))
    stack.wait_for_capacity(renter_key, MODEL, devices=2)
    client = httpx.Client(
        base_url=stack.url, headers={"authorization": f"Bearer {renter_key}"}, timeout=120
    )
    sent: list[dict] = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(renter_requests())
    def honest_answers(request: tuple[str, dict]) -> None:
        path, body = request
        sent.append(body)
        _answered(client.post(path, json=body), body["stream"])

    honest_answers()
    assert len(sent) >= EXAMPLES
    # every verification ends (scored or no verifier) before the devices are judged
    stack.wait_for(
        lambda: not children_rows(
            stack.env, "SELECT id FROM jobs_verification WHERE status = 'offered'"
        ),
        "the verifications scored",
        300,
    )
    failures = children_rows(
        stack.env,
        "SELECT device_id, reason FROM hosts_deviceoutcome WHERE success = false",
    )
    refused = children_rows(
        stack.env,
        "SELECT status, detail FROM jobs_verification WHERE status IN ('refused', 'expired')",
    )
    assert not failures, f"honest devices blamed: {failures}; verifications {refused}"
    flagged = children_rows(
        stack.env, "SELECT id FROM jobs_attempt WHERE token_count_flagged = true"
    )
    assert not flagged, f"honest counts flagged: {flagged}"
    implausible = children_rows(
        stack.env,
        "SELECT v.detail, j.endpoint, j.params, v.round FROM jobs_verification v"
        " JOIN jobs_job j ON j.id = v.job_id WHERE v.plausible = false",
    )
    assert not implausible, f"honest answers judged implausible: {implausible}"
    devices = children_rows(stack.env, "SELECT score, quarantined FROM hosts_device")
    assert len(devices) == 2
    assert all(score >= 60 and not quarantined for score, quarantined in devices), devices
