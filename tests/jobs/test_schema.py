"""The renter API's OpenAPI schema (drf-spectacular) describes every endpoint."""

from __future__ import annotations

import pytest
import yaml
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_the_schema_has_every_renter_endpoint_with_its_shape_and_no_warning(
    tmp_path,
):
    """Before, every view was an ``APIView`` the generator could not read:
    35 errors and the paths left out of ``/api/schema/``."""
    out = tmp_path / "schema.yml"
    call_command("spectacular", "--file", str(out), "--validate", "--fail-on-warn")
    schema = yaml.safe_load(out.read_text())
    paths = schema["paths"]
    for path in (
        "/v1/models",
        "/v1/models/{model_id}",
        "/v1/jobs/{job_id}",
        "/v1/usage",
        "/v1/devices",
        "/v1/rentals",
        "/v1/rentals/{rental_id}",
    ):
        assert path in paths, path
    assert schema["components"]["securitySchemes"]["ApiKey"]["scheme"] == "bearer"
    usage = schema["components"]["schemas"]["Usage"]["properties"]
    assert set(usage) == {"balance", "recent"}
    job = schema["components"]["schemas"]["Job"]["properties"]
    assert {"status", "attempts", "tokens_billed", "cost"} <= set(job)


def _schema(tmp_path) -> dict:
    out = tmp_path / "schema.yml"
    call_command("spectacular", "--file", str(out), "--validate", "--fail-on-warn")
    return yaml.safe_load(out.read_text())


def test_the_completions_are_described_with_their_bounds_and_errors(tmp_path, catalog):
    """Before, ``/v1/chat/completions`` and ``/v1/completions`` (plain async
    views) were left out. Their bounds are the validation's own constants."""
    from jobs import requests as rules

    paths = _schema(tmp_path)["paths"]
    for path, field in (
        ("/v1/chat/completions", "messages"),
        ("/v1/completions", "prompt"),
    ):
        post = paths[path]["post"]
        assert post["requestBody"]["required"] is True
        body = post["requestBody"]["content"]["application/json"]["schema"]
        assert set(body["required"]) == {"model", field}
        props = body["properties"]
        assert props["model"]["enum"] == [catalog.id]
        assert props["max_tokens"]["maximum"] == rules.MAX_MAX_TOKENS
        assert props["temperature"]["maximum"] == rules.TEMPERATURE_RANGE[1]
        assert props["functions"]["enum"] == list(rules.UNSUPPORTED["functions"])
        assert props["placement"]["additionalProperties"] is False
        answers = post["responses"]
        assert set(answers["200"]["content"]) == {
            "application/json",
            "text/event-stream",
        }
        assert {
            "400",
            "401",
            "402",
            "404",
            "409",
            "413",
            "429",
            "502",
            "503",
            "504",
        } <= set(answers)


def test_every_operation_documents_its_errors_and_rentals_their_hours(tmp_path):
    """Before, no error status was documented (14 undocumented 400/401/404
    answers in a schemathesis run) and ``hours: 0`` was schema-valid."""
    from jobs.rentals import MAX_HOURS

    schema = _schema(tmp_path)
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            assert {"401", "503"} <= set(operation["responses"]), (method, path)
            error = operation["responses"]["401"]["content"]["application/json"]
            assert error["schema"]["$ref"] == "#/components/schemas/Error"
    rental = schema["components"]["schemas"]["RentalRequest"]["properties"]["hours"]
    assert (rental["minimum"], rental["maximum"]) == (1, MAX_HOURS)
    assert {"400", "402", "404", "409", "415"} <= set(
        schema["paths"]["/v1/rentals"]["post"]["responses"]
    )
