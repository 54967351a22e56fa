"""``response_format`` and ``logprobs`` on the coordinator (docs/protocol-notes.md
"Output features"): admitted within the subset engines enforce, sent only to
devices whose engine declared the feature (a 503 naming it when none can),
carried by the offer, and the tokens' log-probabilities relayed to the renter
in OpenAI's shapes. The real model's side is tests/agent/test_constrained.py
and tests/e2e/test_structured_output.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.test import AsyncClient
from django.utils import timezone

from jobs.errors import ApiError
from jobs.formats import response_format_of
from jobs.models import Attempt, Job
from jobs.requests import completion_request_parse
from jobs.selectors import devices_eligible, requirement_unmet
from tests.hostsim import MODEL

from .helpers import chat_request, host_online, job_queued, read_body, sse_events

SCHEMA = {
    "title": "Answer",
    "type": "object",
    "properties": {
        "city": {"title": "City", "type": "string", "maxLength": 20},
        "population": {"type": "integer", "description": "people"},
    },
    "required": ["city", "population"],
    "additionalProperties": False,
}
JSON_SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
}
ALL = ("json_object", "json_schema", "logprobs")


def _chat(**fields):
    return completion_request_parse(
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], **fields},
        endpoint="chat",
    )


def _refused(endpoint="chat", **fields) -> ApiError:
    body = {"model": MODEL, **fields}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "x"}]
    else:
        body["prompt"] = "x"
    with pytest.raises(ApiError) as refused:
        completion_request_parse(body, endpoint=endpoint)
    assert refused.value.status == 400
    return refused.value


# --- admission ----------------------------------------------------------------


def _format(**fields) -> dict:
    """The ``response_format`` a request's job keeps (as JSON text)."""
    return response_format_of(_chat(**fields).params)


def test_a_json_object_is_kept_as_asked():
    assert _format(response_format={"type": "json_object"}) == {"type": "json_object"}


def test_a_json_schema_goes_to_hosts_without_its_annotations():
    assert _format(response_format=JSON_SCHEMA) == {
        "type": "json_schema",
        "json_schema": {
            "name": "answer",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "population": {"type": "integer"},
                },
                "required": ["city", "population"],
                "additionalProperties": False,
            },
        },
    }


def test_a_plain_request_keeps_its_params_as_they_were():
    params = _chat(response_format={"type": "text"}, logprobs=False).params
    assert set(params) == {"max_tokens", "temperature", "top_p", "stop", "seed"}


def test_a_pydantic_models_schema_is_admitted():
    """What ``client.chat.completions.parse(response_format=Model)`` sends:
    $defs and $ref, enums, optional fields (anyOf with null), lists."""
    from enum import Enum

    from pydantic import BaseModel, Field

    class Colour(str, Enum):
        RED = "red"
        BLUE = "blue"

    class Item(BaseModel):
        name: str = Field(max_length=12)
        colour: Colour

    class Order(BaseModel):
        items: list[Item] = Field(max_length=3)
        note: str | None = None
        paid: bool

    schema = Order.model_json_schema()
    spec = {"name": "Order", "schema": schema, "strict": True}
    kept = _format(response_format={"type": "json_schema", "json_schema": spec})
    sent = kept["json_schema"]["schema"]
    assert sent["$defs"]["Item"]["properties"]["colour"] == {
        "$ref": "#/$defs/Colour"
    }
    assert "title" not in json.dumps(sent)


@pytest.mark.parametrize(
    "schema, param",
    [
        ({"type": "string", "pattern": "^a+$"}, "schema.pattern"),
        ({"type": "integer", "minimum": 0}, "schema.minimum"),
        ({"type": "string", "format": "email"}, "schema.format"),
        ({"oneOf": [{"type": "string"}]}, "schema.oneOf"),
        ({"allOf": [{"type": "string"}]}, "schema.allOf"),
        ({"not": {"type": "string"}}, "schema.not"),
        ({"type": "array", "uniqueItems": True}, "schema.uniqueItems"),
        ({"type": "array", "minItems": 2}, "schema.minItems"),
        (
            {"type": "array", "items": {"type": "string"}, "minItems": 300},
            "schema.minItems",
        ),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "schema.minLength"),
        ({"type": ["string", "null"], "maxLength": 3}, "schema.maxLength"),
        ({"enum": [1, "a"], "type": "string"}, "schema.type"),
        (
            {"type": "object", "properties": {"a": {}}, "required": ["b"]},
            "schema.required",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "integer", "maximum": 3}}},
            "schema.properties.a.maximum",
        ),
        ({"$ref": "https://example.com/s.json"}, "schema.$ref"),
        ({"$ref": "#/$defs/Missing"}, "schema.$ref"),
        ({"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/A"}}}, "schema"),
        (
            {"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}},
             "$ref": "#/$defs/A"},
            "schema",
        ),
        ({"type": "object", "minProperties": 1}, "schema.minProperties"),
        ([{"type": "string"}], "schema"),
    ],
)
def test_a_schema_keyword_no_grammar_enforces_is_a_400_naming_it(schema, param):
    """Never accepted and ignored: a keyword outside the subset every engine
    with ``json_schema`` enforces is refused before dispatch, by its path."""
    spec = {"name": "s", "schema": schema}
    error = _refused(response_format={"type": "json_schema", "json_schema": spec})
    assert error.param == f"response_format.json_schema.{param}", error.message


def test_a_schema_that_refers_to_itself_inside_an_object_is_admitted():
    """Recursion that opens an object first (a tree) has a grammar."""
    tree = {
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}
                },
            }
        },
        "$ref": "#/$defs/Node",
    }
    spec = {"name": "tree", "schema": tree}
    assert _chat(response_format={"type": "json_schema", "json_schema": spec})


def _spec(json_schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": json_schema}


@pytest.mark.parametrize(
    "response_format, param",
    [
        ("json", "response_format"),
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        (_spec({"schema": {}}), "response_format.json_schema.name"),
        (_spec({"name": "a b", "schema": {}}), "response_format.json_schema.name"),
        (_spec({"name": "a"}), "response_format.json_schema.schema"),
        ({"type": "json_object", "json_schema": {}}, "response_format.json_schema"),
        (_spec({"name": "a", "schema": {}, "x": 1}), "response_format.json_schema.x"),
    ],
)
def test_a_bad_response_format_is_a_400_naming_the_field(response_format, param):
    assert _refused(response_format=response_format).param == param


def test_response_format_is_for_chat_only():
    error = _refused("completion", response_format={"type": "json_object"})
    assert error.param == "response_format"


@pytest.mark.parametrize(
    "fields, wanted",
    [
        ({"logprobs": True}, 0),
        ({"logprobs": True, "top_logprobs": 3}, 3),
        ({"logprobs": True, "top_logprobs": 20}, 20),
        ({"logprobs": False, "top_logprobs": 0}, None),  # clients' defaults
        ({"logprobs": None}, None),
    ],
)
def test_chat_logprobs_become_the_alternatives_wanted(fields, wanted):
    assert _chat(**fields).params.get("logprobs") == wanted


@pytest.mark.parametrize(
    "endpoint, fields, param",
    [
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ("chat", {"logprobs": 1}, "logprobs"),
        ("completion", {"logprobs": 21}, "logprobs"),
        ("completion", {"logprobs": "3"}, "logprobs"),
        ("completion", {"logprobs": 2, "top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_bad_logprobs_are_a_400_naming_the_field(endpoint, fields, param):
    assert _refused(endpoint, **fields).param == param


def test_completions_take_logprobs_as_the_number_of_alternatives():
    parsed = completion_request_parse(
        {"model": MODEL, "prompt": "x", "logprobs": 5}, endpoint="completion"
    )
    assert parsed.params["logprobs"] == 5


# --- eligibility ----------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "params, feature, named",
    [
        ({"response_format": '{"type":"json_object"}'}, "json_object", "json_object"),
        (
            {"response_format": '{"type":"json_schema"}'},
            "json_schema",
            "response_format json_schema",
        ),
        ({"logprobs": 2}, "logprobs", "logprobs"),
    ],
)
def test_only_a_device_whose_engine_declared_the_feature_is_eligible(
    live_device, renter, catalog, params, feature, named
):
    others = [f for f in ALL if f != feature]
    live_device("without", features=others)
    job = job_queued(renter, catalog)
    job.params = {"max_tokens": 8, **params}
    now = timezone.now()
    assert devices_eligible(job=job, model=catalog, now=now) == []
    unmet = requirement_unmet(
        model=catalog, placement={}, now=now, features=job.features_needed
    )
    assert named in unmet and f"'{feature}'" in unmet
    able = live_device("with", features=[feature])
    assert devices_eligible(job=job, model=catalog, now=now) == [able]
    assert (
        requirement_unmet(
            model=catalog, placement={}, now=now, features=job.features_needed
        )
        is None
    )


def test_a_hello_keeps_the_features_this_coordinator_knows():
    from hosts.protocol import FrameError, parse_hello
    from tests.hostsim import HostSim

    hello = HostSim("t").hello_frame(features=["telepathy", "logprobs", "logprobs"])
    assert parse_hello(hello)["features"] == ["logprobs"]
    assert parse_hello(HostSim("t").hello_frame())["features"] == []
    with pytest.raises(FrameError, match="features"):
        parse_hello(HostSim("t").hello_frame(features="logprobs"))


# --- the relay -----------------------------------------------------------------


def _entry(text: str, logprob: float = -0.5, alternatives: int = 0) -> dict:
    item = {"token": text, "logprob": logprob, "bytes": list(text.encode())}
    tops = [
        {"token": f"t{i}", "logprob": logprob - i - 1, "bytes": list(f"t{i}".encode())}
        for i in range(alternatives)
    ]
    return {**item, "top_logprobs": tops}


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_no_live_device_with_the_feature_is_a_503_naming_it(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "plain", features=("logprobs",))
    response = await chat_request(api_key, stream=False, response_format=JSON_SCHEMA)
    assert response.status_code == 503
    error = json.loads(response.content)["error"]
    assert error["code"] == "no_capacity"
    assert "response_format json_schema" in error["message"]
    assert "'json_schema'" in error["message"]
    assert await host.ws.receive_nothing(timeout=0.1), "no offer to a plain device"
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_offer_carries_the_format_and_the_logprobs_asked(
    catalog, api_key, machine_token
):
    plain = await host_online(machine_token, "plain", score=95)
    able = await host_online(machine_token, "able", score=50, features=ALL)
    request = chat_request(
        api_key, response_format=JSON_SCHEMA, logprobs=True, top_logprobs=2
    )
    offer = await able.recv_type("offer")
    assert offer["response_format"] == _format(response_format=JSON_SCHEMA)
    assert list(offer["response_format"]["json_schema"]["schema"]["properties"]) == [
        "city",
        "population",
    ], "the properties in the schema's order (the output's)"
    assert offer["logprobs"] == 2
    assert "logprobs" not in offer["params"]
    assert await plain.ws.receive_nothing(timeout=0.1), "the best score cannot serve it"
    job = offer["job"]
    await able.claim(job)
    first = [_entry("{", alternatives=2), _entry('"city": ', alternatives=2)]
    await able.token(job, '{"city": ', logprobs=first)
    rest = '"Paris", "population": 2}'
    await able.token(job, rest, logprobs=[_entry(rest, -1.0, 2)])
    await able.done(job, 3)
    response = await request
    events = [e for e in sse_events(await read_body(response)) if e != "[DONE]"]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert json.loads(text) == {"city": "Paris", "population": 2}
    content = [
        item
        for e in events
        if e["choices"][0]["logprobs"] is not None
        for item in e["choices"][0]["logprobs"]["content"]
    ]
    assert [c["token"] for c in content] == ["{", '"city": ', rest]
    assert content[0]["top_logprobs"] == _entry("{", alternatives=2)["top_logprobs"]
    assert b"".join(bytes(c["bytes"]) for c in content) == text.encode()
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    for host in (plain, able):
        await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_whole_response_carries_every_tokens_logprobs(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "able", features=ALL)
    request = chat_request(api_key, stream=False, logprobs=True)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    for piece in ("Hel", "lo", "!"):
        await host.token(offer["job"], piece, logprobs=[_entry(piece)])
    await host.done(offer["job"], 3)
    body = json.loads((await request).content)
    choice = body["choices"][0]
    assert choice["message"]["content"] == "Hello!"
    assert [c["token"] for c in choice["logprobs"]["content"]] == ["Hel", "lo", "!"]
    assert choice["logprobs"]["refusal"] is None
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_completion_gets_openais_completions_logprobs(
    catalog, api_key, machine_token
):
    host = await host_online(machine_token, "able", features=ALL)
    prompt = "Say é"
    request = asyncio.create_task(
        AsyncClient().post(
            "/v1/completions",
            data={"model": MODEL, "prompt": prompt, "logprobs": 1},
            content_type="application/json",
            headers={"authorization": f"Bearer {api_key}"},
        )
    )
    offer = await host.recv_type("offer")
    assert offer["logprobs"] == 1
    await host.claim(offer["job"])
    await host.token(offer["job"], " é", logprobs=[_entry(" é", -0.1, 1)])
    await host.token(offer["job"], "té", logprobs=[_entry("té", -0.2, 1)])
    await host.done(offer["job"], 2)
    logprobs = json.loads((await request).content)["choices"][0]["logprobs"]
    assert logprobs == {
        "tokens": [" é", "té"],
        "token_logprobs": [-0.1, -0.2],
        "top_logprobs": [{"t0": -1.1}, {"t0": -1.2}],
        "text_offset": [len(prompt), len(prompt) + 2],  # characters, not bytes
    }
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    "extra",
    [
        {},  # asked for, not sent: never a silent drop
        {"logprobs": [_entry("a-much-longer-token")]},  # more bytes than the text
        {"logprobs": [{**_entry("Hi"), "logprob": 0.5}]},
        {"logprobs": [_entry("Hi", alternatives=3)]},  # more alternatives than asked
    ],
    ids=["missing", "bytes past the text", "positive", "too many alternatives"],
)
async def test_a_token_frame_without_the_logprobs_asked_fails_the_attempt(
    catalog, api_key, machine_token, fast_deadlines, extra
):
    host = await host_online(machine_token, "sloppy", features=ALL)
    request = chat_request(api_key, stream=False, logprobs=True, top_logprobs=2)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], "Hi", **extra)
    assert (await host.recv_type("error"))["message"].startswith("token:")
    response = await request
    assert response.status_code == 502, "its only device failed it"
    attempt = await Attempt.objects.aget(id=offer["job"])
    assert attempt.outcome == Attempt.Outcome.HOST_ERROR
    await host.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_continuation_goes_on_under_the_same_format(
    catalog, api_key, machine_token, fast_deadlines
):
    first = await host_online(machine_token, "first", score=90, features=ALL)
    second = await host_online(machine_token, "second", score=60, features=ALL)
    plain = await host_online(machine_token, "plain", score=95)
    request = chat_request(api_key, response_format=JSON_SCHEMA, logprobs=True)
    offer = await first.recv_type("offer")
    await first.claim(offer["job"])
    await first.token(offer["job"], '{"city": "Pa', logprobs=[_entry('{"city": "Pa')])
    response = await request
    body = asyncio.create_task(read_body(response))
    await first.close()
    resume = await second.recv_type("offer")
    assert resume["continue_from"] == '{"city": "Pa'
    assert resume["response_format"] == offer["response_format"]
    assert resume["logprobs"] == 0
    await second.claim(resume["job"])
    rest = 'ris", "population": 3}'
    await second.token(resume["job"], rest, logprobs=[_entry(rest)])
    await second.done(resume["job"], 4)
    events = [e for e in sse_events(await body) if e != "[DONE]"]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert json.loads(text) == {"city": "Paris", "population": 3}
    tokens = [
        c["token"]
        for e in events
        if e["choices"][0]["logprobs"]
        for c in e["choices"][0]["logprobs"]["content"]
    ]
    assert tokens == ['{"city": "Pa', rest]
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    assert job.failed_over and job.status == Job.Status.SUCCEEDED
    assert await plain.ws.receive_nothing(timeout=0.1)
    for host in (second, plain):
        await host.close()


def test_every_schema_form_the_engine_tests_enforce_is_admitted():
    """tests/agent/test_constrained.py runs ``ADMITTED`` on the real model:
    the coordinator admits each of them as it is (no annotations to drop)."""
    from jobs.schemas import schema_checked
    from tests.agent.test_constrained import ADMITTED

    for form, schema in ADMITTED.items():
        assert schema_checked(schema, param="schema") == schema, form


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_renter_websocket_gets_the_same_logprobs_and_format(
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
    await ws.send_json_to(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "JSON please"}],
            "response_format": {"type": "json_object"},
            "logprobs": True,
            "top_logprobs": 1,
        }
    )
    offer = await host.recv_type("offer")
    assert offer["response_format"] == {"type": "json_object"}
    await host.claim(offer["job"])
    await host.token(offer["job"], "{}", logprobs=[_entry("{}", alternatives=1)])
    await host.done(offer["job"], 1)
    chunk = await ws.receive_json_from(timeout=5)
    assert chunk["choices"][0]["delta"]["content"] == "{}"
    assert chunk["choices"][0]["logprobs"]["content"] == [_entry("{}", alternatives=1)]
    while (await ws.receive_json_from(timeout=5)).get("type") != "done":
        pass
    await ws.disconnect()
    await host.close()


@pytest.mark.parametrize("kind", [{}, [], 1, True])
def test_a_schema_type_that_is_not_a_name_is_a_400_not_a_500(kind):
    """Found by the schemathesis run (tests/fuzz): ``{"type": {}}`` raised a
    TypeError (a 500) looking the value up among the JSON types."""
    schema = {"type": kind}
    refused = _refused(
        response_format={
            "type": "json_schema",
            "json_schema": {
                "name": "x",
                "schema": {"type": "object", "properties": {"a": schema}},
            },
        }
    )
    assert refused.param.startswith("response_format.json_schema.schema")
