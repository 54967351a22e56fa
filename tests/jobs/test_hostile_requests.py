"""Findings of a hostile walk-through, each kept as the failing input (a regression
test per bug): renters' requests that must be refused, each answered as
documented (OpenAI's error body, the field named) and never offered to a host."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import AsyncClient

from jobs.models import Attempt
from tests.hostsim import MODEL

from .helpers import chat_request, host_online

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_a_prompt_longer_than_the_context_is_a_400_and_costs_no_host_anything(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "rig")
    response = await chat_request(api_key, content="word " * 2100, max_tokens=1)
    assert response.status_code == 400
    body = json.loads(response.content)
    assert body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["param"] == "messages"
    assert await host.ws.receive_nothing(timeout=0.2), "never offered to a host"
    assert not await Attempt.objects.aexists()
    await host.close()


async def test_unknown_v1_paths_and_big_bodies_answer_openai_shaped_json(
    catalog, api_key
):
    client = AsyncClient()
    auth = {"authorization": f"Bearer {api_key}"}
    for path, message in (
        ("/v1/embeddings", "no such API endpoint: GET /v1/embeddings"),
        ("/v1/jobs/xyz", "no such job: xyz"),
        ("/v1/rentals/xyz", "no such rental: xyz"),
        (f"/v1/jobs/{uuid.uuid4()}", "no such job"),
    ):
        response = await client.get(path, headers=auth)
        assert response.status_code == 404
        error = json.loads(response.content)["error"]
        assert error["code"] == "not_found" and error["message"].startswith(message)
    response = await client.get(f"/v1/models/{MODEL}", headers=auth)
    assert json.loads(response.content)["id"] == MODEL
    response = await client.post(
        "/v1/chat/completions",
        data=b'{"model": "' + b"x" * (11 * 1024 * 1024) + b'"}',
        content_type="application/json",
        headers=auth,
    )
    assert response.status_code == 413
    assert json.loads(response.content)["error"]["code"] == "body_too_large"


@pytest.mark.parametrize(
    "content, needle", [("hi\u0000there", "NUL"), ("hi \ud800", "not valid UTF-8")]
)
async def test_unstorable_text_in_a_request_is_a_400(catalog, api_key, content, needle):
    response = await chat_request(api_key, content=content)
    assert response.status_code == 400
    body = json.loads(response.content)
    assert (
        needle in body["error"]["message"]
        and body["error"]["param"] == "messages[0].content"
    )


async def test_deeply_nested_json_is_refused_cleanly(catalog, api_key, machine_token):
    deep = '{"model": "x", "messages": ' + "[" * 50000 + "]" * 50000 + "}"
    response = await AsyncClient().post(
        "/v1/chat/completions",
        data=deep,
        content_type="application/json",
        headers={"authorization": f"Bearer {api_key}"},
    )
    assert response.status_code == 400
    host = await host_online(machine_token, "rig")
    await host.ws.send_to(text_data="[" * 100000 + "]" * 100000)
    assert (await host.recv_type("error"))["message"] == "frame is not valid JSON"
    await host.heartbeat()  # the connection is still served
    await host.close()


async def test_json_nested_past_the_recursion_limit_is_a_400_on_every_api(
    catalog, api_key
):
    """``[[[[…]]]]`` 100,000 deep: the DRF APIs answered a 500 (RecursionError),
    the completions a 400 (found by a fresh-eyes check)."""
    client = AsyncClient()
    auth = {"authorization": f"Bearer {api_key}"}
    deep = b"[" * 100_000 + b"]" * 100_000
    for path in ("/v1/rentals", "/v1/chat/completions"):
        response = await client.post(
            path, data=deep, content_type="application/json", headers=auth
        )
        assert response.status_code == 400, (path, response.content[:200])
        assert json.loads(response.content)["error"]["type"] == "invalid_request_error"


async def test_what_the_schema_fuzzer_found_is_answered_as_documented(catalog, api_key):
    """Found by schemathesis (tests/fuzz): a ``/v1/`` path with a newline was
    Django's HTML 404 (``.*`` stops at one); a form body to ``/v1/rentals`` was
    parsed into strings and answered as a bad device (now 415: the API takes
    JSON); ``"role": {}`` was a 500 (TypeError)."""
    client = AsyncClient()
    auth = {"authorization": f"Bearer {api_key}"}
    response = await client.get("/v1/models/x%0A", headers=auth)
    assert (
        response.status_code == 404 and response["content-type"] == "application/json"
    )
    assert json.loads(response.content)["error"]["code"] == "not_found"
    response = await client.post(
        "/v1/rentals", data={"device": "1", "hours": "1"}, headers=auth
    )
    assert response.status_code == 415
    assert json.loads(response.content)["error"]["type"] == "invalid_request_error"
    response = await client.post(
        "/v1/chat/completions",
        data={"model": MODEL, "messages": [{"role": {}, "content": ""}]},
        content_type="application/json",
        headers=auth,
    )
    assert response.status_code == 400
    assert json.loads(response.content)["error"]["param"] == "messages[0].role"
