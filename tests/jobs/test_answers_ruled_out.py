"""An answer its ``response_format`` rules out (``jobs.formats.answer_ruled_out``;
fresh-eyes review 5: a host answering junk text to ``json_schema``,
``json_object`` and ``tools`` requests was paid, and its renter billed). What
only a cut can explain (``max_tokens``, a stop sequence) is not judged; a
whole answer that is not the JSON asked is a failed check of its device,
billed nothing. The honest reference engine's answers run through the same
rule in ``tests/e2e/test_structured_output.py`` and the honest-host property
test."""

from __future__ import annotations

import pytest

from billing.models import Earning
from hosts.models import DeviceOutcome
from jobs.formats import answer_ruled_out, features_needed, response_format_stored
from jobs.models import Attempt, Job

from .helpers import chat_request, host_online, read_body
from .output_features import ALL, JSON_SCHEMA


def _params(response_format: dict | None, **more) -> dict:
    params = dict(more)
    if response_format is not None:
        params["response_format"] = response_format_stored(response_format)
    return params


OBJECT = {"type": "json_object"}
SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "n", "schema": {"type": "object", "properties": {}}},
}
ARRAY = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "array"}}}


@pytest.mark.parametrize(
    "response_format, text, finish_reason, more, ruled_out",
    [
        (OBJECT, "The answer is banana.", "stop", {}, True),
        (OBJECT, ' {"a": 1}\n', "stop", {}, False),
        (OBJECT, "[1, 2]", "stop", {}, True),  # JSON, not an object
        (SCHEMA, '{"a": [1, {"b": null}]}', "stop", {}, False),
        (SCHEMA, '"banana"', "stop", {}, True),
        (ARRAY, "[]", "stop", {}, False),
        (ARRAY, "{}", "stop", {}, True),
        (OBJECT, '{"a": ', "length", {}, False),  # max_tokens cut it
        (OBJECT, '{"a": ', "stop", {"stop": ["1"]}, False),  # a stop sequence may have
        (OBJECT, '{"a": ', "stop", {}, True),
        (None, "banana", "stop", {}, False),  # plain text: anything goes
    ],
)
def test_what_rules_an_answer_out(response_format, text, finish_reason, more, ruled_out):
    found = answer_ruled_out(_params(response_format, **more), text, finish_reason, [])
    assert bool(found) is ruled_out, found


def test_json_nested_past_the_parser_is_not_judged():
    deep = "[" * 100_000 + "]" * 100_000
    assert answer_ruled_out(_params(OBJECT), deep, "stop", None) == ""


@pytest.mark.parametrize(
    "temperature, token_ids, ruled_out",
    [(1.5, None, True), (1.5, [1, 2], False), (1.0, None, False), (None, None, False)],
)
def test_above_temperature_1_the_ids_must_come(temperature, token_ids, ruled_out):
    """Such a job went to an engine declaring ``token_ids``
    (``features_needed``): an answer without them broke its word."""
    params = _params(None, temperature=temperature)
    assert ("token_ids" in features_needed(params)) is (temperature == 1.5)
    found = answer_ruled_out(params, "banana", "stop", token_ids)
    assert bool(found) is ruled_out, found


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    "finish_reason, text, blamed",
    [("stop", "The answer is banana banana.", True), ("length", '{"city": "Par', False)],
)
async def test_junk_under_a_schema_is_a_failed_check_billed_nothing(
    catalog, api_key, machine_token, finish_reason, text, blamed
):
    host = await host_online(machine_token, "cheat", features=ALL)
    request = chat_request(api_key, response_format=JSON_SCHEMA, max_tokens=40)
    offer = await host.recv_type("offer")
    await host.claim(offer["job"])
    await host.token(offer["job"], text)
    await host.done(offer["job"], 6, finish_reason=finish_reason)
    response = await request
    assert response.status_code == 200
    await read_body(response)
    job = await Job.objects.aget(id=response["x-ballast-job-id"])
    attempt = await Attempt.objects.aget(job=job)
    failed = DeviceOutcome.objects.filter(
        device_id=attempt.device_id,
        source=DeviceOutcome.Source.SPOT_CHECK,
        success=False,
    )
    details = [d async for d in failed.values_list("detail", flat=True)]
    earned = await Earning.objects.filter(attempt=attempt).aexists()
    if blamed:
        assert details and "not JSON" in details[0], details
        assert attempt.tokens_billed == 0 and not earned
    else:
        assert details == [] and attempt.tokens_billed > 0 and earned
    await host.close()


