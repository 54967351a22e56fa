"""Function calling through the relay (docs/tools.md): the offer carries the
tool-call format's constraint (a ``json_schema`` response format) and the
rendered conversation; the host's text reaches the renter as OpenAI's
``tool_calls`` (streamed deltas, a whole message, the renter websocket), and
a continuation goes on under the same constraint from the exact prefix, the
calls neither repeated nor lost."""

from __future__ import annotations

import asyncio
import json

import pytest

from jobs.models import Job
from tests.hostsim import MODEL

from .helpers import chat_request, host_online, read_body, sse_events
from .output_features import ALL

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


def _calls(events: list) -> dict[int, dict]:
    """The calls assembled from streamed ``delta.tool_calls`` as the SDK does."""
    calls: dict[int, dict] = {}
    for event in events:
        for piece in event["choices"][0]["delta"].get("tool_calls", []):
            call = calls.setdefault(piece["index"], {"arguments": ""})
            call.update({k: piece[k] for k in ("id", "type") if k in piece})
            if "name" in piece["function"]:
                call["name"] = piece["function"]["name"]
            call["arguments"] += piece["function"]["arguments"]
    return calls


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_call_is_streamed_as_tool_call_deltas(catalog, api_key, machine_token):
    able = await host_online(machine_token, "able", features=ALL)
    request = chat_request(
        api_key, messages=MESSAGES, tools=[WEATHER], tool_choice="required"
    )
    offer = await able.recv_type("offer", timeout=30)
    schema = offer["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["tool_calls"]
    item = schema["properties"]["tool_calls"]["items"]
    assert item["properties"]["name"] == {"const": "get_weather"}
    assert item["properties"]["arguments"]["required"] == ["city"]
    system, user = offer["messages"]
    assert system["role"] == "system" and "get_weather" in system["content"]
    assert user == MESSAGES[0]
    job = offer["job"]
    await able.claim(job)
    for piece in (
        '{"tool_calls": [{"name": "get_',
        'weather", "arguments": {"ci',
        'ty": "Paris"}}]}',
    ):
        await able.token(job, piece)
    await able.done(job, 12)
    response = await request
    events = [e for e in sse_events(await read_body(response)) if e != "[DONE]"]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    (call,) = _calls(events).values()
    assert call["name"] == "get_weather" and call["type"] == "function"
    assert call["id"].startswith("call_")
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert not any(e["choices"][0]["delta"].get("content") for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    await able.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_whole_answer_has_message_tool_calls_or_content(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "able", features=ALL)
    answers = [
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Lyon"}}]}',
        '{"content": "It is \\"sunny\\"."}',
    ]
    bodies = []
    for text in answers:
        request = chat_request(
            api_key, stream=False, messages=MESSAGES, tools=[WEATHER]
        )
        offer = await host.recv_type("offer", timeout=30)
        assert len(offer["response_format"]["json_schema"]["schema"]["anyOf"]) == 2
        await host.claim(offer["job"])
        await host.token(offer["job"], text)
        await host.done(offer["job"], 9)
        bodies.append(json.loads((await request).content))
    called, spoke = (body["choices"][0] for body in bodies)
    assert called["finish_reason"] == "tool_calls"
    assert called["message"]["content"] is None
    (call,) = called["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Lyon"}'}
    assert spoke["finish_reason"] == "stop"
    assert spoke["message"]["content"] == 'It is "sunny".'
    assert "tool_calls" not in spoke["message"]
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_call_cut_mid_arguments_is_continued_exactly(
    catalog, api_key, machine_token, fast_deadlines
):
    first = await host_online(machine_token, "first", score=90, features=ALL)
    second = await host_online(machine_token, "second", score=60, features=ALL)
    request = chat_request(
        api_key,
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    offer = await first.recv_type("offer", timeout=30)
    await first.claim(offer["job"])
    prefix = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Pa'
    await first.token(offer["job"], prefix)
    response = await request
    body = asyncio.create_task(read_body(response))
    await first.close()
    resume = await second.recv_type("offer", timeout=30)
    assert resume["continue_from"] == prefix
    assert resume["response_format"] == offer["response_format"]
    assert resume["messages"] == offer["messages"]
    await second.claim(resume["job"])
    await second.token(resume["job"], 'ris"}}]}')
    await second.done(resume["job"], 4)
    events = [e for e in sse_events(await body) if e != "[DONE]"]
    calls = _calls(events)
    assert list(calls) == [0]
    assert calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert job.failed_over and job.status == Job.Status.SUCCEEDED
    await second.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_renter_websocket_gets_the_same_tool_call_chunks(
    catalog, api_key, machine_token
):
    from channels.testing import WebsocketCommunicator

    from ballast.asgi import application

    host = await host_online(machine_token, "able", features=ALL)
    ws = WebsocketCommunicator(
        application,
        "/ws/v1/chat/",
        headers=[(b"authorization", f"Bearer {api_key}".encode())],
    )
    assert (await ws.connect())[0]
    await ws.send_json_to({"model": MODEL, "messages": MESSAGES, "tools": [WEATHER]})
    offer = await host.recv_type("offer", timeout=30)
    await host.claim(offer["job"])
    await host.token(
        offer["job"], '{"tool_calls": [{"name": "get_weather", "arguments": '
    )
    await host.token(offer["job"], '{"city": "Oslo"}}]}')
    await host.done(offer["job"], 9)
    chunks = []
    while (message := await ws.receive_json_from(timeout=5)).get("type") != "done":
        chunks.append(message)
    assert json.loads(_calls(chunks)[0]["arguments"]) == {"city": "Oslo"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert message["finish_reason"] == "tool_calls"
    await ws.disconnect()
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_no_device_able_to_constrain_is_a_503_naming_tools(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "plain")
    response = await chat_request(api_key, messages=MESSAGES, tools=[WEATHER])
    assert response.status_code == 503
    message = json.loads(response.content)["error"]["message"]
    assert "tools" in message and "'json_schema'" in message
    await host.close()
