"""A request's parameters as ``jobs.requests.completion_request_parse`` checks
them: ``n``, ``seed``, ``stream_options``, the output budget (``max_tokens``,
``max_completion_tokens``) and the message roles, each refused with a 400
naming the field; what Ballast cannot honour is refused, and the values
clients send by default are accepted."""

from __future__ import annotations

import pytest

from jobs.errors import ApiError
from jobs.models import Job
from jobs.requests import completion_request_parse

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("n", [2, 0, True, "1", 1.5])
def test_only_n_1_is_accepted(n):
    with pytest.raises(ApiError) as refused:
        completion_request_parse(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "n": n},
            endpoint=Job.Endpoint.CHAT,
        )
    assert refused.value.status == 400 and refused.value.param == "n"


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 10**30, True, "1", 1.5])
def test_a_seed_past_64_bits_or_not_an_integer_is_refused(seed):
    with pytest.raises(ApiError) as refused:
        completion_request_parse(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "seed": seed,
            },
            endpoint=Job.Endpoint.CHAT,
        )
    assert refused.value.status == 400 and refused.value.param == "seed"


@pytest.mark.parametrize("seed", [0, -1, 2**63 - 1, -(2**63)])
def test_any_64_bit_seed_is_accepted(seed):
    parsed = completion_request_parse(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": seed},
        endpoint=Job.Endpoint.CHAT,
    )
    assert parsed.params["seed"] == seed


def _parse(**fields):
    return completion_request_parse(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], **fields},
        endpoint=Job.Endpoint.CHAT,
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"stream_options": {"include_usage": True}},  # not streamed
        {"stream": False, "stream_options": {}},
        {"stream": True, "stream_options": []},
        {"stream": True, "stream_options": {"include_usage": "yes"}},
    ],
)
def test_stream_options_belong_to_a_stream(fields):
    with pytest.raises(ApiError) as refused:
        _parse(**fields)
    assert refused.value.status == 400 and refused.value.param == "stream_options"


@pytest.mark.parametrize(
    "name, asking",
    [
        ("functions", [{"name": "f"}]),
        ("function_call", "auto"),
        ("echo", True),
        ("suffix", "tail"),
        ("best_of", 2),
        ("logit_bias", {"50256": -100}),
        ("echo", 1),
        ("presence_penalty", 5),
        ("frequency_penalty", "x"),
        ("frequency_penalty", 1.5),
        ("modalities", ["text", "audio"]),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("prediction", {"type": "content", "content": "x"}),
        ("web_search_options", {}),
    ],
)
def test_what_ballast_cannot_honour_is_a_400_naming_it(name, asking):
    """A client asking for legacy functions, echo, … gets a clear error, not a
    plain answer that silently ignored the request (``response_format`` and
    ``logprobs`` are served: tests/jobs/test_output_features_*.py; ``tools``
    too: tests/jobs/test_toolcalls_requests.py)."""
    with pytest.raises(ApiError) as refused:
        _parse(**{name: asking})
    assert refused.value.status == 400 and refused.value.param == name
    assert "not supported" in refused.value.message


def test_the_values_clients_send_by_default_are_accepted():
    assert _parse(n=None).params["max_tokens"]  # null: the default n (1)
    assert _parse(best_of=1.0, top_logprobs=0.0, n=1.0)  # 1.0 is the number 1
    parsed = _parse(
        stream=True,
        stream_options={"include_usage": True},
        tools=[],
        tool_choice="none",
        logprobs=False,
        top_logprobs=None,
        echo=False,
        suffix=None,
        best_of=1,
        logit_bias={},
        presence_penalty=0,
        frequency_penalty=0.0,
        modalities=["text"],
        response_format={"type": "text"},
    )
    assert parsed.stream and parsed.include_usage
    assert not _parse(stream=True, stream_options={}).include_usage


@pytest.mark.parametrize("role", [{}, [], ["user"]])
def test_a_role_that_is_not_a_string_is_a_400_not_a_server_error(role):
    """Found by schemathesis (tests/fuzz): ``{"role": {}}`` reached a set
    membership test, TypeError, a 500."""
    with pytest.raises(ApiError) as refused:
        completion_request_parse(
            {"model": "m", "messages": [{"role": role, "content": ""}]}, endpoint="chat"
        )
    assert (refused.value.status, refused.value.param) == (400, "messages[0].role")


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"max_completion_tokens": 5, "max_tokens": 8193}, "max_tokens"),
        ({"max_completion_tokens": 0, "max_tokens": 5}, "max_completion_tokens"),
        ({"max_completion_tokens": None, "max_tokens": "9"}, "max_tokens"),
    ],
)
def test_each_budget_field_given_is_checked(fields, param):
    """Found by schemathesis: with ``max_completion_tokens`` given, a
    ``max_tokens`` of 8193 was ignored, not refused."""
    with pytest.raises(ApiError) as refused:
        completion_request_parse(
            {"model": "m", "prompt": "hi", **fields}, endpoint="completion"
        )
    assert (refused.value.status, refused.value.param) == (400, param)


@pytest.mark.parametrize(
    "fields, budget",
    [
        ({}, 256),
        ({"max_tokens": 7}, 7),
        ({"max_completion_tokens": 9, "max_tokens": 7}, 9),
        ({"max_completion_tokens": None, "max_tokens": 7}, 7),
    ],
)
def test_max_completion_tokens_wins_over_max_tokens(fields, budget):
    parsed = completion_request_parse(
        {"model": "m", "prompt": "hi", **fields}, endpoint="completion"
    )
    assert parsed.params["max_tokens"] == budget


def test_a_region_no_machine_can_be_in_is_a_400_listing_the_codes():
    """``placement.region`` is one of the offered codes (``hosts.regions``):
    another is the renter's mistake, not a 503 for want of capacity."""
    with pytest.raises(ApiError) as refused:
        _parse(placement={"region": "mars"})
    assert refused.value.param == "placement.region" and "eu" in refused.value.message
    assert _parse(placement={"region": "eu"}).placement == {"region": "eu"}
