"""Verification of a real answer on real processes (DESIGN.md "Verifying real
answers"): two agents of two owners run SmolLM2-135M-Instruct through llama.cpp;
every answer is verified (``BALLAST_VERIFY_RATE`` 1), so the answer one host
wrote is scored by prefill on the other, judged plausible, and the verifier is
paid for it by the platform."""

from __future__ import annotations

import pytest
from openai import OpenAI

from ballast.stack import last_line, manage

from .env import children_rows

MODEL = "smollm2-135m-instruct"

pytestmark = pytest.mark.e2e


@pytest.fixture
def e2e_env(e2e_env):
    e2e_env["BALLAST_VERIFY_RATE"] = "1"
    e2e_env["BALLAST_SPOT_CHECKS"] = "0"  # only the renter's job and its verification
    e2e_env["BALLAST_VERIFY_SECOND_SHARE"] = "0"  # one round: none drawn a second time
    return e2e_env


def _host(stack, owner: str, name: str) -> None:
    token = last_line(manage("machine_create", owner, name, env=stack.env))
    stack.start_agent(name, token)


@pytest.mark.parametrize("temperature", [0, 0.8])
def test_a_real_answer_is_verified_by_another_owners_device(stack, renter_key, temperature):
    _host(stack, "host-a@example.com", "rig-a")
    _host(stack, "host-b@example.com", "rig-b")
    stack.wait_for_capacity(renter_key, MODEL, devices=2)
    client = OpenAI(base_url=stack.url + "/v1", api_key=renter_key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name three colours of the rainbow."}],
        temperature=temperature,
        max_tokens=40,
    )
    assert raw.parse().choices[0].message.content
    job_id = raw.headers["x-ballast-job-id"].replace("-", "")

    def scored() -> list[tuple]:
        return children_rows(
            stack.env,
            "SELECT v.status, v.verdict, v.plausible, v.n, v.paid_nano,"
            " v.device_id, v.verifier_id, v.detail FROM jobs_verification v"
            f" WHERE replace(CAST(v.job_id AS TEXT), '-', '') = '{job_id}'",
        )

    stack.wait_for(lambda: any(r[0] != "offered" for r in scored()), "a verification scored", 120)
    (status, verdict, plausible, n, paid, device, verifier, detail), = scored()
    assert (status, verdict, plausible) == ("scored", "plausible", True), detail
    assert n > 0 and paid > 0
    assert device != verifier
    owners = children_rows(
        stack.env,
        "SELECT d.id, m.owner_id FROM hosts_device d JOIN hosts_machine m"
        f" ON m.id = d.machine_id WHERE d.id IN ({device}, {verifier})",
    )
    assert len({owner for _, owner in owners}) == 2, "the verifier is another owner's"
