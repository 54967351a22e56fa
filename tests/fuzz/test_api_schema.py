"""The renter API against its OpenAPI schema (issue 26, item 5): schemathesis
generates requests for every operation of ``/api/schema/`` (its coverage phase's
boundary cases, the completions' invalid ones only, and random ones: 25 each,
``tests.fuzz.knobs``)
and sends them to a real coordinator with a scripted agent online; every answer
must be as the schema says and nothing may be a server error (``tests.fuzz.api``).
The long form is ``bench/fuzz.py api``."""

from __future__ import annotations

import pytest
import schemathesis

from . import knobs
from .api import (
    ADDITIONAL_CHECKS,
    EXCLUDED_CHECKS,
    MODEL,
    api_stack,
    case_run,
    fuzz_config,
)

pytestmark = pytest.mark.fuzz


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with api_stack(tmp_path_factory.mktemp("fuzz-api")) as running:
        yield running
        print(f"statuses seen: {dict(sorted(running.statuses.items()))}")


@pytest.fixture
def api_schema(api):
    config = fuzz_config(
        api,
        examples=knobs.examples(),
        seed=None if knobs.random_sequence() else 26,
        bounded=not knobs.full(),
    )
    return schemathesis.openapi.from_url(f"{api.url}/api/schema/", config=config)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
def test_every_renter_endpoint_answers_as_its_schema_says(case, api):
    case_run(api, case)


def test_real_ids_and_streams_answer_as_the_schema_says(api, api_schema):
    """What random generation rarely reaches: a rental made, read and ended, the
    renter's own job (random ids are 404s), answers streamed with their usage
    chunk; and nothing the whole module sent made the coordinator log an error."""

    def checked(path: str, method: str, status: int = 200, **data):
        case = api_schema[path][method].Case(**data)
        response = case.call_and_validate(
            headers=api.headers,
            additional_checks=ADDITIONAL_CHECKS,
            excluded_checks=EXCLUDED_CHECKS,
        )
        assert response.status_code == status, (case.operation.label, response.text)
        return (
            response.json() if "json" in response.headers["content-type"][0] else None
        )

    device = checked("/v1/devices", "GET")["data"][0]["id"]
    rental = checked(
        "/v1/rentals",
        "POST",
        201,
        body={"device": device, "hours": 720},
        media_type="application/json",
    )
    for method in ("GET", "DELETE", "GET"):
        ids = {"rental_id": rental["id"]}
        assert checked("/v1/rentals/{rental_id}", method, path_parameters=ids)
    for path, body in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ):
        for stream in (False, True):
            extra = {"stream_options": {"include_usage": True}} if stream else {}
            checked(
                path,
                "POST",
                body={"model": MODEL, **body, "stream": stream, **extra},
                media_type="application/json",
            )
    job = checked("/v1/jobs/{job_id}", "GET", path_parameters={"job_id": api.job_id})
    assert job["status"] == "succeeded"
    assert not api.errors(), "\n".join(api.errors())
