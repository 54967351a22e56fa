"""Placement a host cannot talk its way into, on real processes (issue 32 item
4): an agent that declares an RTX 4090 (kind ``gpu``) while running the real
model on this machine's CPU gets no ``placement.gpu: "4090"`` job — a 503
naming the requirement, before and after Ballast measured it — while requests
without placement run on it; the same agent telling the truth reports its CPU
as ``cpu0``."""

from __future__ import annotations

import httpx
import pytest

from catalog.gpus import FLOORS, TOP

from .env import children_rows

MODEL = "smollm2-135m-instruct"
CHEAT = ("--name", "NVIDIA GeForce RTX 4090", "--kind", "gpu")

pytestmark = pytest.mark.e2e


@pytest.fixture
def e2e_env(e2e_env):
    """The children's environment with deadlines a loaded CI machine meets
    (this test is about placement, not deadlines)."""
    e2e_env["BALLAST_CLAIM_TIMEOUT_S"] = "60"
    e2e_env["BALLAST_FIRST_TOKEN_TIMEOUT_S"] = "60"
    return e2e_env


def ask(stack, key: str, placement: dict | None = None) -> httpx.Response:
    """A chat request long enough to be measured (the model writes on for 64
    tokens at temperature 0)."""
    body = {
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "Write a long story about a lighthouse."}
        ],
        "temperature": 0,
        "max_tokens": 64,
    }
    if placement is not None:
        body["placement"] = placement
    return httpx.post(
        f"{stack.url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )


def attempt_device(stack, key: str, response: httpx.Response) -> str:
    job = httpx.get(
        f"{stack.url}/v1/jobs/{response.headers['x-ballast-job-id']}",
        headers={"Authorization": f"Bearer {key}"},
    ).json()
    [attempt] = job["attempts"]
    return attempt["device"]


def refused(response: httpx.Response, field: str) -> str:
    assert response.status_code == 503, response.text
    message = response.json()["error"]["message"]
    assert f"placement.{field}" in message, message
    return message


def test_a_cpu_declared_as_an_rtx_4090_gets_no_4090_job(stack, renter_key, machine):
    token = machine("rig-1")
    stack.start_agent("rig-1", token, *CHEAT)
    stack.wait_for_capacity(renter_key, MODEL)

    assert "not measured yet" in refused(ask(stack, renter_key, {"gpu": "4090"}), "gpu")
    for _ in range(3):  # unplaced work runs, and is measured
        answer = ask(stack, renter_key)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] >= 32
        assert attempt_device(stack, renter_key, answer) == "rig-1/gpu0"
    [(speed, jobs, placed)] = children_rows(
        stack.env,
        "SELECT measured_tokens_per_s, measured_jobs, placed_name"
        " FROM hosts_devicemodel",
    )
    assert jobs >= 3 and speed is not None
    assert speed < FLOORS[MODEL][TOP], f"this CPU measured like a 4090: {speed}"
    assert placed == ""
    message = refused(ask(stack, renter_key, {"gpu": "4090"}), "gpu")
    assert f"measured {speed:.0f} tokens/s" in message
    assert "below the 250 tokens/s of a RTX 4090" in message
    refused(ask(stack, renter_key, {"min_vram_gb": 16}), "min_vram_gb")
    assert ask(stack, renter_key).status_code == 200

    # the same machine's agent (its key), telling the truth: its CPU, as a CPU
    stack.kill("rig-1")
    stack.start_agent("rig-1", token)
    stack.wait_for(
        lambda: children_rows(
            stack.env, "SELECT kind FROM hosts_device WHERE retired_at IS NULL"
        )
        == [("cpu",)],
        "the device declared a CPU",
        60,
    )
    stack.wait_for_capacity(renter_key, MODEL)
    answer = ask(stack, renter_key)
    assert answer.status_code == 200, answer.text
    assert attempt_device(stack, renter_key, answer) == "rig-1/cpu0"
    message = refused(ask(stack, renter_key, {"min_vram_gb": 1}), "min_vram_gb")
    assert "a CPU is never placed by gpu or VRAM" in message
