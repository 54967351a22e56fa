"""Fuzzing the renter API against its OpenAPI schema (schemathesis), on real
processes: a coordinator started the way the README starts it, one agent with the
scripted engine (so completions are answered, 200 and streamed), a renter with
1,000 USD of credit. Shared by ``tests/fuzz/test_api_schema.py`` (bounded) and
``bench/fuzz.py`` (longer).

What is checked on every case: schemathesis's checks (no server error — 502, 503
and 504 are the completions' documented answers, a 500 is not —, the status,
content type, headers and body as documented, schema-invalid data refused,
schema-valid data accepted, the key enforced) with two changes made here:
``valid_data_accepted`` (a schema-valid completion whose prompt plus
``max_tokens`` cannot fit the model's context is a ``400
context_length_exceeded``: a rule of tokens the schema cannot state) and
``stream_chunks_conform`` (each streamed chunk as its component says); and the
coordinator's log gains no error (``ApiStack.new_errors``).
"""

from __future__ import annotations

import re

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import jsonschema
import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance, use_after_free

from ballast.stack import Stack, last_line, manage
from tests.e2e.env import children_env

MODEL = "smollm2-135m-instruct"
ANSWER = "The answer is 4."
# the completions' designed answers of the 5xx class (PROTOCOL.md §1); a 500 is a bug
DESIGNED_5XX = ["502", "503", "504"]
# what in the coordinator's log is an error: its own loggers' ERROR records,
# uvicorn's "Exception in ASGI application", any traceback
ERROR_MARKS = (" ERROR ", "ERROR:", "Traceback (most recent call last)")


@dataclass
class ApiStack:
    """A running coordinator and scripted agent with a renter's ``key`` and a
    real ``job_id`` (a finished completion)."""

    stack: Stack
    key: str
    job_id: str
    statuses: Counter = field(default_factory=Counter)
    log_read: int = 0

    @property
    def url(self) -> str:
        return self.stack.url

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def errors(self) -> list[str]:
        """Every error line of the coordinator's log so far."""
        return _error_lines(self._log_text())

    def new_errors(self) -> list[str]:
        """The error lines the coordinator logged since the last call."""
        text = self._log_text()
        fresh, self.log_read = text[self.log_read :], len(text)
        return _error_lines(fresh)

    def _log_text(self) -> str:
        return (self.stack.log_dir / "coordinator.log").read_text(errors="replace")


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(m in line for m in ERROR_MARKS)]


@contextmanager
def api_stack(var_dir: Path) -> Iterator[ApiStack]:
    """Start the coordinator and the scripted agent (their own database, see
    ``tests.e2e.env``), make the renter and its first job."""
    with children_env(var_dir / "var") as env:
        env["BALLAST_SPOT_CHECKS"] = "0"  # a rental stays pending: nothing to judge
        with Stack(env=env, log_dir=var_dir / "logs") as stack:
            stack.migrate()
            stack.start_coordinator()
            key = last_line(
                manage("renter_create", "fuzz@example.com", "--credit", "1000", env=env)
            )
            token = last_line(
                manage("machine_create", "host@example.com", "rig", env=env)
            )
            script = json.dumps({"text": ANSWER})
            stack.start_agent(
                "agent", token, "--engine", "scripted", "--script", script
            )
            stack.wait_for_capacity(key, MODEL)
            yield ApiStack(stack, key, _seeded(stack.url, key))


def _seeded(url: str, key: str) -> str:
    """A finished job of the renter (its id), so reads of a real id are checked
    too (random ids are 404s)."""
    answer = httpx.post(
        f"{url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    answer.raise_for_status()
    return answer.headers["x-ballast-job-id"]


def rental_end(url: str, key: str, rental_id: str) -> None:
    """End a rental a case made (its device serves completions again)."""
    httpx.delete(
        f"{url}/v1/rentals/{rental_id}",
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    ).raise_for_status()


def fuzz_config(
    api: ApiStack, *, examples: int, seed: int | None, bounded: bool
) -> schemathesis.Config:
    """The run's configuration: the renter's key on every request, ``examples``
    generated cases per operation in the fuzzing phase (the coverage phase's
    boundary cases come on top), the designed 5xx not server errors.
    ``bounded`` (CI): the completions' coverage phase sends only its invalid
    cases (each a quick 400), not the hundreds of valid ones that each wait
    for an answer (the fuzzing phase still sends valid ones)."""
    data: dict = {
        "headers": api.headers,
        "generation": {"max-examples": examples},
        "max-stream-events": 10_000,  # a whole answer, to its [DONE]
        "checks": {
            "not_a_server_error": {
                "expected-statuses": ["2xx", "3xx", "4xx", *DESIGNED_5XX]
            }
        },
    }
    if bounded:
        data["operations"] = [
            {
                "include-path-regex": "completions$",
                "phases": {"coverage": {"generation": {"mode": "negative"}}},
            }
        ]
    if seed is not None:
        data["seed"] = seed
    return schemathesis.Config.from_dict(data)


RELATED = re.compile(
    r"tool_choice\.function\.name|tools\[\d+\]\.function\.name"
    r"|messages\[\d+\]\.tool_call_id"
    r"|messages\[\d+\]\.tool_calls\[\d+\]\.function\.arguments"
)
"""The params of 400s about what one field's value means for another's."""


@schemathesis.check
def valid_data_accepted(ctx, response, case):
    """schemathesis's ``positive_data_acceptance``, except that a completion whose
    prompt plus ``max_tokens`` pass the model's context is a 400
    ``context_length_exceeded`` (the schema can bound neither in tokens), and
    what no schema relates (a 400 naming it): a named ``tool_choice`` must
    name one of the request's ``tools``, tools need distinct names, a tool
    message answers a call an earlier message made, a call's arguments are
    JSON text."""
    if (
        response.status_code == 400
        and _error_code(response) == "context_length_exceeded"
    ):
        return None
    if response.status_code == 400 and RELATED.fullmatch(_error_param(response) or ""):
        return None
    return positive_data_acceptance(ctx, response, case)


def _error_param(response) -> str | None:
    try:
        return response.json()["error"]["param"]
    except (ValueError, KeyError, TypeError):
        return None


def _error_code(response) -> str | None:
    try:
        return response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


@schemathesis.check
def stream_chunks_conform(ctx, response, case):
    """Each ``data:`` event of a streamed completion is its chunk component as
    JSON (``jobs.schema.completion_answers.events_schema``: OpenAPI 3.0 cannot
    nest it), ``[DONE]`` last."""
    if not response.headers.get("content-type", [""])[0].startswith(
        "text/event-stream"
    ):
        return None
    raw = case.operation.schema.raw_schema
    name = (
        "ChatCompletionChunk"
        if "chat" in case.operation.path
        else "TextCompletionChunk"
    )
    validator = jsonschema.Draft7Validator(
        {
            "$ref": f"#/components/schemas/{name}",
            "components": _json_schema(raw["components"]),
        }
    )
    events = [
        b[len("data: ") :]
        for b in response.text.split("\n\n")
        if b.startswith("data: ")
    ]
    assert events and events[-1] == "[DONE]", f"the stream ends with {events[-1:]}"
    for event in events[:-1]:
        validator.validate(json.loads(event))
    return True


def _json_schema(node):
    """OpenAPI 3.0's ``nullable: true`` as JSON Schema (``anyOf`` with null)."""
    if isinstance(node, list):
        return [_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v) for k, v in node.items() if k != "nullable"}
    return {"anyOf": [out, {"type": "null"}]} if node.get("nullable") else out


# what every case is checked with besides the configured built-in checks
ADDITIONAL_CHECKS = [valid_data_accepted, stream_chunks_conform]
# ``use_after_free``: DELETE /v1/rentals/{id} ends a rental, whose record stays
# readable (its bill; docs/protocol-notes.md), so a GET after it is a 200 by design
EXCLUDED_CHECKS = [positive_data_acceptance, use_after_free]


def case_run(api: ApiStack, case) -> None:
    """Send one case, check it (see the module), count its status; a rental it
    made is ended at once, so the device serves the completions again."""
    response = case.call_and_validate(
        additional_checks=ADDITIONAL_CHECKS, excluded_checks=EXCLUDED_CHECKS
    )
    api.statuses[f"{case.operation.label} {response.status_code}"] += 1
    if case.operation.label == "POST /v1/rentals" and response.status_code == 201:
        rental_end(api.url, api.key, response.json()["id"])
    errors = api.new_errors()
    assert not errors, "the coordinator logged an error:\n" + "\n".join(errors)
