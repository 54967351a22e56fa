"""End to end on real processes: coordinator (uvicorn), an agent running
SmolLM2-135M-Instruct through llama.cpp, and the official ``openai`` client."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

MODEL = "smollm2-135m-instruct"

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(stack, renter_key, machine) -> OpenAI:
    stack.start_agent("agent-1", machine("rig-1"))
    stack.wait_for_capacity(renter_key, MODEL)
    return OpenAI(base_url=stack.url + "/v1", api_key=renter_key, max_retries=0)


def test_it_answers_streamed_through_the_openai_client(client, stack, renter_key):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 2+2?"}],
        temperature=0,
        max_tokens=48,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    text = "".join(pieces)
    assert "4" in text
    assert len(pieces) > 1, "the answer must arrive as a stream of pieces"
    assert usage is not None and 0 < usage.completion_tokens <= len(text)


def test_it_answers_not_streamed_and_records_the_job(client, stack, renter_key):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 2+2?"}],
        temperature=0,
        max_tokens=48,
    )
    completion = raw.parse()
    assert "4" in completion.choices[0].message.content
    assert completion.choices[0].finish_reason in ("stop", "length")
    job_id = raw.headers["x-ballast-job-id"]
    job = httpx.get(
        f"{stack.url}/v1/jobs/{job_id}",
        headers={"Authorization": f"Bearer {renter_key}"},
    ).json()
    assert job["status"] == "succeeded"
    assert job["failed_over"] is False
    assert job["tokens_billed"] == completion.usage.completion_tokens
    assert len(job["attempts"]) == 1
    attempt = job["attempts"][0]
    assert attempt["outcome"] == "succeeded" and attempt["kind"] == "fresh"
    assert attempt["device"].startswith("rig-1/")
    assert attempt["output_chars"] == len(completion.choices[0].message.content)
    assert float(job["cost"]) > 0
    usage = httpx.get(
        f"{stack.url}/v1/usage", headers={"Authorization": f"Bearer {renter_key}"}
    ).json()
    assert usage["recent"][0]["job"] == job_id
    assert float(usage["balance"]) < 5


def test_it_completes_a_raw_prompt(client):
    completion = client.completions.create(
        model=MODEL, prompt="The opposite of hot is", max_tokens=8, temperature=0
    )
    assert completion.choices[0].text.strip() != ""
    assert completion.usage.completion_tokens > 0
