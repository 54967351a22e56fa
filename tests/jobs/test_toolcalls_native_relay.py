"""Function calling for a model in a native tool-call format, through the
relay: the catalog model's ``tool_call_format`` is ``hermes`` (its template
Qwen 2.5's), so the offer carries the prompt its template renders and a
``json_sequence`` constraint, goes only to devices declaring that feature
(else a 503 naming it), and the host's ``<tool_call>`` blocks reach the
renter as OpenAI's ``tool_calls``, also across a failover from the exact
prefix (a cut in the middle of the ``<tool_call>`` literal)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from catalog.modeldata import model_tokenizers_forget
from catalog.models import ModelData
from jobs.models import Job
from modeldata.modelfile import VocabData
from tests.modeldata.vectors import VectorsUnavailable, template_read

from .helpers import chat_request, host_online, read_body, sse_events
from .test_toolcalls_relay import MESSAGES, WEATHER, _calls

SEQUENCE = ("json_schema", "json_sequence")
CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)


@pytest.fixture
def hermes(catalog):
    """The catalog's model with Qwen 2.5's chat template: format ``hermes``."""
    try:
        template = template_read("Qwen-Qwen2.5-7B-Instruct")
    except VectorsUnavailable as exc:
        pytest.skip(f"llama.cpp's templates cannot be downloaded: {exc}")
    data = ModelData.objects.get(model=catalog)
    vocab = VocabData.from_json(data.vocab_json)
    data.vocab_json = dataclasses.replace(vocab, chat_template=template).to_json()
    data.save()
    catalog.tool_call_format = "hermes"
    catalog.save()
    model_tokenizers_forget()
    yield catalog
    model_tokenizers_forget()


def _asked(api_key, **extra) -> asyncio.Task:
    return chat_request(
        api_key, messages=MESSAGES, tools=[WEATHER], tool_choice="required", **extra
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_device_without_the_feature_is_never_offered_it(
    hermes, api_key, machine_token
):
    host = await host_online(machine_token, "schema-only", features=("json_schema",))
    response = await _asked(api_key, stream=False)
    assert response.status_code == 503
    error = json.loads(response.content)["error"]
    assert error["code"] == "no_capacity"
    assert "in the model's own tool-call format" in error["message"]
    assert "'json_sequence'" in error["message"]
    assert await host.ws.receive_nothing(timeout=0.1)
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_calls_in_the_models_format_are_continued_exactly(
    hermes, api_key, machine_token, fast_deadlines
):
    first = await host_online(machine_token, "first", score=90, features=SEQUENCE)
    second = await host_online(machine_token, "second", score=60, features=SEQUENCE)
    request = _asked(api_key)
    offer = await first.recv_type("offer", timeout=30)
    assert "messages" not in offer
    prompt = offer["prompt"]
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in prompt
    assert prompt.endswith(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )
    spec = offer["response_format"]["json_sequence"]
    assert (spec["prefix"], spec["suffix"]) == ("<tool_call>\n", "\n</tool_call>")
    assert spec["schema"]["properties"]["name"] == {"const": "get_weather"}
    await first.claim(offer["job"])
    await first.token(offer["job"], CALL + "\n<tool_ca")
    response = await request
    body = asyncio.create_task(read_body(response))
    await first.close()
    resume = await second.recv_type("offer", timeout=30)
    assert resume["continue_from"] == CALL + "\n<tool_ca"
    assert resume["prompt"] == prompt
    assert resume["response_format"] == offer["response_format"]
    await second.claim(resume["job"])
    rest = 'll>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    await second.token(resume["job"], rest)
    await second.done(resume["job"], 20)
    events = [e for e in sse_events(await body) if e != "[DONE]"]
    calls = _calls(events)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Oslo"}),
    ]
    assert not any(e["choices"][0]["delta"].get("content") for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert job.failed_over and job.status == Job.Status.SUCCEEDED
    assert job.messages is None and job.prompt == prompt
    await second.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("stream", [True, False])
async def test_text_that_might_have_begun_a_call_reaches_the_renter_at_the_end(
    hermes, api_key, machine_token, stream
):
    """Under ``auto`` an answer that stops while it could still have become
    a ``<tool_call>`` is text: held back while it might begin a call, given
    as content with the last chunk, never dropped."""
    host = await host_online(machine_token, "able", features=SEQUENCE)
    request = chat_request(
        api_key, messages=MESSAGES, tools=[WEATHER], tool_choice="auto", stream=stream
    )
    offer = await host.recv_type("offer", timeout=30)
    assert offer["response_format"]["json_sequence"]["text_unless"] == "<tool_call>\n"
    await host.claim(offer["job"])
    await host.token(offer["job"], "<tool")
    await host.token(offer["job"], "_c")
    await host.done(offer["job"], 3)
    response = await request
    if stream:
        events = [e for e in sse_events(await read_body(response)) if e != "[DONE]"]
        deltas = [e["choices"][0]["delta"] for e in events]
        assert [d.get("content") for d in deltas if d.get("content")] == ["<tool_c"]
        assert events[-1]["choices"][0] == {
            "index": 0,
            "delta": {"role": "assistant", "content": "<tool_c"},  # the only chunk
            "finish_reason": "stop",
            "logprobs": None,
        }
    else:
        choice = json.loads(response.content)["choices"][0]
        assert choice["message"]["content"] == "<tool_c"
        assert "tool_calls" not in choice["message"]
        assert choice["finish_reason"] == "stop"
    await host.close()
