"""``response_format`` and ``logprobs`` end to end on real processes: the
coordinator, an agent running SmolLM2-135M-Instruct through llama.cpp, and the
official ``openai`` client unmodified (its structured-output helper
``client.chat.completions.parse`` with a pydantic model, its logprobs)."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field

MODEL = "smollm2-135m-instruct"

pytestmark = pytest.mark.e2e


class City(BaseModel):
    name: str = Field(max_length=20)
    population: int
    capital: bool


def city_schema() -> dict:
    """The schema the SDK sends for ``City`` (strict: no extra properties)."""
    return {**City.model_json_schema(), "additionalProperties": False}


@pytest.fixture
def e2e_env(e2e_env):
    # the first host of the failover test stalls until the test kills it; no
    # spot check may reach its scripted device meanwhile
    e2e_env["BALLAST_STALL_TIMEOUT_S"] = "120"
    e2e_env["BALLAST_SPOT_CHECKS"] = "0"
    return e2e_env


def test_the_sdk_parses_a_pydantic_model_and_reads_logprobs(
    stack, renter_key, machine
):
    stack.start_agent("rig-1", machine("rig-1"))
    stack.wait_for_capacity(renter_key, MODEL)
    client = OpenAI(base_url=stack.url + "/v1", api_key=renter_key, max_retries=0)

    completion = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        response_format=City,
        temperature=0,
        max_tokens=120,
    )
    city = completion.choices[0].message.parsed
    assert isinstance(city, City) and city.name

    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 2+2?"}],
        temperature=0,
        max_tokens=24,
        stream=True,
        logprobs=True,
        top_logprobs=3,
    )
    text, entries = "", []
    for chunk in stream:
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        if choice.logprobs and choice.logprobs.content:
            entries.extend(choice.logprobs.content)
    assert text and b"".join(bytes(e.bytes) for e in entries) == text.encode()
    assert all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in entries)

    raw = client.completions.create(
        model=MODEL, prompt="The opposite of hot is", max_tokens=6, logprobs=2
    )
    logprobs = raw.choices[0].logprobs
    assert "".join(logprobs.tokens) == raw.choices[0].text
    assert logprobs.text_offset[0] == len("The opposite of hot is")
    assert all(len(alternatives) == 2 for alternatives in logprobs.top_logprobs)


def test_a_json_answer_cut_by_a_dead_host_is_continued_to_a_valid_one(
    stack, renter_key, machine
):
    """The first host (scripted) streams the start of a JSON answer and stops
    mid-string; it is SIGKILLed; the continuation runs on the real model from
    the delivered prefix under the same schema: the whole answer parses and
    validates, and the tokens' log-probabilities cover it across both hosts."""
    script = {
        "pieces": ['{"name', '": "Ly'],
        "mode": "stall_at",
        "n": 2,
        "features": ["json_schema", "logprobs"],
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
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "City", "schema": city_schema(), "strict": True},
    }
    received: list[str] = []
    entries: list = []
    prefix_seen = threading.Event()
    outcome: dict = {}

    def renter() -> None:
        raw = client.chat.completions.with_streaming_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Describe Lyon as JSON."}],
            response_format=response_format,
            logprobs=True,
            temperature=0,
            max_tokens=120,
            stream=True,
        )
        with raw as response:
            outcome["job"] = response.headers["x-ballast-job-id"]
            for chunk in response.parse():
                choice = chunk.choices[0]
                received.append(choice.delta.content or "")
                if choice.logprobs and choice.logprobs.content:
                    entries.extend(choice.logprobs.content)
                if "".join(received) == '{"name": "Ly':
                    prefix_seen.set()
                if choice.finish_reason:
                    outcome["finish"] = choice.finish_reason

    reader = threading.Thread(target=renter)
    reader.start()
    assert prefix_seen.wait(60), f"the prefix never came: {received}"
    stack.start_agent("rig-real", machine("rig-real"))
    stack.wait_for_capacity(renter_key, MODEL, devices=2)
    stack.kill("rig-dies")
    reader.join(180)
    assert not reader.is_alive()

    answer = "".join(received)
    assert answer.startswith('{"name": "Ly')
    city = City.model_validate_json(answer)
    assert city.name.startswith("Ly")
    assert outcome["finish"] == "stop"
    assert b"".join(bytes(e.bytes) for e in entries) == answer.encode()
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
