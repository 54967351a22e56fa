"""``response_format`` and ``logprobs`` go only to devices whose engine declared
the feature (docs/protocol-notes.md "Output features"): a hello keeps the
features this coordinator knows, and a request no live device can serve is a
503 naming the feature."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from jobs.selectors import devices_eligible, requirement_unmet

from .helpers import chat_request, host_online, job_queued
from .output_features import ALL, JSON_SCHEMA


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
