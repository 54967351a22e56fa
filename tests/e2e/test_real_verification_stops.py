"""A renter's ``stop`` sequence no longer exempts an answer from verification
on the host's word (issue 32 item 3), on real processes: two agents of two
owners run SmolLM2-135M-Instruct through llama.cpp, every answer is verified
(``BALLAST_VERIFY_RATE`` 1). The host's own ``done.token_ids`` show the
coordinator whether the stop cut its last token (then the whole tokens before
it are verified) or fell where a token ended (then all of it); either way the
other owner's real model finds the honest answer plausible."""

from __future__ import annotations

import pytest
from openai import OpenAI

from ballast.stack import last_line, manage

from .env import children_rows

MODEL = "smollm2-135m-instruct"
PROMPT = "Name three colours of the rainbow."
# the reference model's greedy answer begins "The rainbow is a beautiful
# sight": " beautiful" is one token, so "autiful" begins inside it

pytestmark = pytest.mark.e2e


@pytest.fixture
def e2e_env(e2e_env):
    e2e_env["BALLAST_VERIFY_RATE"] = "1"
    e2e_env["BALLAST_VERIFY_SECOND_SHARE"] = "0"
    e2e_env["BALLAST_SPOT_CHECKS"] = "0"  # only the renter's job and its verification
    return e2e_env


def _host(stack, owner: str, name: str) -> None:
    token = last_line(manage("machine_create", owner, name, env=stack.env))
    stack.start_agent(name, token)


@pytest.mark.parametrize("stop, exemption", [("autiful", "stop_cut"), (" beautiful", "")])
def test_an_answer_a_stop_sequence_ended_is_verified_by_what_its_ids_show(
    stack, renter_key, stop, exemption
):
    _host(stack, "host-a@example.com", "rig-a")
    _host(stack, "host-b@example.com", "rig-b")
    stack.wait_for_capacity(renter_key, MODEL, devices=2)
    client = OpenAI(base_url=stack.url + "/v1", api_key=renter_key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        temperature=0,
        max_tokens=40,
        stop=[stop],
    )
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "stop"
    content = choice.message.content
    assert stop not in content
    job_id = raw.headers["x-ballast-job-id"].replace("-", "")
    [(kind, verify_text, output)] = children_rows(
        stack.env,
        "SELECT a.exemption, a.verify_text, a.output_text FROM jobs_attempt a"
        f" WHERE replace(CAST(a.job_id AS TEXT), '-', '') = '{job_id}'",
    )
    assert output == content
    assert kind == exemption
    if exemption:
        assert verify_text and content.startswith(verify_text) and verify_text != content
    else:
        assert verify_text is None

    def scored() -> list[tuple]:
        return children_rows(
            stack.env,
            "SELECT v.status, v.verdict, v.plausible, v.detail FROM jobs_verification v"
            f" WHERE replace(CAST(v.job_id AS TEXT), '-', '') = '{job_id}'",
        )

    stack.wait_for(lambda: any(r[0] != "offered" for r in scored()), "a verification scored", 120)
    (status, verdict, plausible, detail), = scored()
    assert (status, verdict, plausible) == ("scored", "plausible", True), detail
