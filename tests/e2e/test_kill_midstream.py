"""DESIGN.md "When a host fails", on real processes: two agents run the real model;
the test SIGKILLs the one that is streaming; the renter's answer goes on from exactly
what it had received and completes."""

from __future__ import annotations

import signal

import httpx
import pytest
from openai import OpenAI

MODEL = "smollm2-135m-instruct"

pytestmark = pytest.mark.e2e


def test_it_survives_the_streaming_agent_being_killed(stack, renter_key, machine):
    for name in ("rig-a", "rig-b"):
        stack.start_agent(name, machine(name))
    stack.wait_for_capacity(renter_key, MODEL, devices=2)
    client = OpenAI(base_url=stack.url + "/v1", api_key=renter_key, max_retries=0)
    raw = client.chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=[
            {
                "role": "user",
                "content": "Write a long story about a dragon who learns to bake bread.",
            }
        ],
        temperature=0,
        max_tokens=200,
        stream=True,
    )
    with raw as response:
        job_id = response.headers["x-ballast-job-id"]
        received_before_kill = ""
        after_kill: list[str] = []
        finish = None
        killed = False
        for chunk in response.parse():
            if not chunk.choices:
                continue
            piece = chunk.choices[0].delta.content or ""
            if chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            if not killed:
                received_before_kill += piece
                if len(received_before_kill) >= 40:
                    job = httpx.get(
                        f"{stack.url}/v1/jobs/{job_id}",
                        headers={"Authorization": f"Bearer {renter_key}"},
                    ).json()
                    streaming_machine = job["attempts"][0]["device"].split("/")[0]
                    stack.kill(streaming_machine, signal.SIGKILL)
                    killed = True
            else:
                after_kill.append(piece)
    assert killed, "the answer was too short to kill the host mid-stream"
    full = received_before_kill + "".join(after_kill)
    assert full.startswith(received_before_kill)
    assert "".join(after_kill).strip(), (
        "the continuation produced the rest of the answer"
    )
    assert finish in ("stop", "length")
    job = httpx.get(
        f"{stack.url}/v1/jobs/{job_id}",
        headers={"Authorization": f"Bearer {renter_key}"},
    ).json()
    assert job["status"] == "succeeded" and job["failed_over"] is True
    kinds = [(a["kind"], a["outcome"]) for a in job["attempts"]]
    assert kinds == [("fresh", "died_midstream"), ("continuation", "succeeded")]
    first, second = job["attempts"]
    assert first["device"] != second["device"]
    assert first["output_chars"] + second["output_chars"] == len(full)
    assert job["tokens_billed"] == first["tokens_billed"] + second["tokens_billed"]
    # the continuation goes on from the prefix; it does not start the answer again
    rest = "".join(after_kill)
    assert received_before_kill[:20] not in rest
