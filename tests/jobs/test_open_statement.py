"""The request step's statement with its text kept per shape
(``jobs.services._OpenStatement``): the text built once, the parameters made
alone afterwards, must be the statement the field-by-field build makes, for
every shape the text depends on (``_open_shape``)."""

from __future__ import annotations

import itertools
import random
import uuid
from datetime import datetime

import pytest
from django.db import connection  # noqa: F401 - the skipif condition reads it

from jobs import services
from jobs.models import CatalogModel, Job
from jobs.requests import completion_request_parse
from tests.conftest import REFERENCE_MODEL

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        "connection.vendor != 'postgresql'",
        reason="the one-statement request step is PostgreSQL's",
    ),
]

KEY_STEP = (
    "SELECT k.user_id, k.id AS key_id FROM jobs_apikey k WHERE k.key_hash = %s",
    ["a-key-hash"],
)
ONE_TRIP = ("SELECT %s::bigint AS user_id, %s::bigint AS key_id", [7, 8])


def _request(endpoint: str, stream: bool, max_tokens: int = 40):
    body: dict = {"model": REFERENCE_MODEL["id"], "max_tokens": max_tokens}
    if endpoint == Job.Endpoint.CHAT:
        body["messages"] = [{"role": "user", "content": "Hi there"}]
    else:
        body["prompt"] = "Once upon a time"
    if stream:
        body["stream"] = True
    return completion_request_parse(body, endpoint=endpoint)


def _statement(request, model, waiting_channel, renter, guess=None):
    """(sql, params) of a fresh ``_OpenStatement`` (the tie-break drawn the same)."""
    random.seed(11)
    step = services._OpenStatement(
        request=request,
        model=model,
        waiting_channel=waiting_channel,
        renter_sql=renter[0],
        renter_params=renter[1],
        guess=guess,
    )
    sql, params, prepare = step.statement
    assert prepare
    return step, sql, params


def _comparable(step, params: list) -> list:
    """``params`` of ``step``'s statement with its own ids and times named
    (the job's, the attempt's, the other id a guess would store, now, the job's
    creation and lease), any other id or time replaced by the order it first
    appears in (two statements differ in those, never in where they put them),
    and every other value kept with its type (psycopg's Int8 is not an int)."""
    named = {
        step.job.id: "job",
        step.attempt.id: "attempt",
        step.claim.guess_other_id: "other attempt",
        step.now: "now",
        step.job.created_at: "created",
        step.job.lease_until: "lease",
    }
    seen: dict = {}
    out = []
    for value in params:
        if isinstance(value, (uuid.UUID, datetime)):
            name = named.get(value) or seen.setdefault(value, len(seen))
            out.append((type(value).__name__, name))
        else:
            out.append((type(value), getattr(value, "obj", value)))
    return out


@pytest.mark.parametrize(
    "endpoint,stream,free,waiting,renter,guessed",
    [
        (*shape, renter, guessed)
        for shape in itertools.product(
            (Job.Endpoint.CHAT, Job.Endpoint.COMPLETION),
            (False, True),
            (False, True),  # the model free (price 0: a literal in the text)
            ("", "w.1"),
        )
        for renter, guessed in ((KEY_STEP, True), (ONE_TRIP, False))
    ],
)
def test_the_kept_text_and_its_parameters_are_the_statement_built_afresh(
    catalog, endpoint, stream, free, waiting, renter, guessed
):
    model = catalog
    if free:
        model = CatalogModel.objects.create(
            **{**REFERENCE_MODEL, "id": "free-model", "price_completion_nano": 0}
        )
    guess = (
        services.GuessedPick(device_id=5, device_index=0, machine_channel="m.5")
        if guessed
        else None
    )
    request = _request(endpoint, stream)
    services._open_texts.clear()
    built, built_sql, built_params = _statement(request, model, waiting, renter, guess)
    assert len(services._open_texts) == 1  # the shape's text is kept
    kept, kept_sql, kept_params = _statement(request, model, waiting, renter, guess)
    assert not hasattr(kept.claim, "ctes")  # not built again
    assert kept_sql == built_sql
    assert _comparable(kept, kept_params) == _comparable(built, built_params)
    # the ids and times are the kept step's own
    assert kept.job.id in kept_params and kept.attempt.id in kept_params
    assert kept.job.created_at in kept_params and kept.now in kept_params
    assert kept.job.lease_until in kept_params
    assert kept.claim.select_count == built.claim.select_count
    # another request of the same shape (other messages, max_tokens) keeps the text
    other = _request(endpoint, stream, max_tokens=7)
    _, other_sql, other_params = _statement(other, model, waiting, renter, guess)
    assert other_sql == built_sql
    assert len(other_params) == len(built_params)
    assert 7 * model.price_completion_nano in other_params


def test_a_placement_builds_its_statement_every_time(catalog):
    request = completion_request_parse(
        {
            "model": REFERENCE_MODEL["id"],
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "Hi"}],
            "placement": {"region": "eu"},
        },
        endpoint=Job.Endpoint.CHAT,
    )
    services._open_texts.clear()
    step, sql, _ = _statement(request, catalog, "w.1", KEY_STEP)
    assert "UPPER(m.region) = %s" in sql
    assert services._open_texts == {} and hasattr(step.claim, "ctes")


def test_a_kept_text_whose_parameters_do_not_fit_is_refused(catalog, monkeypatch):
    request = _request(Job.Endpoint.CHAT, True)
    services._open_texts.clear()
    _statement(request, catalog, "w.1", KEY_STEP)
    ((shape, text),) = services._open_texts.items()
    services._open_texts[shape] = services._OpenText(
        sql=text.sql, job_fields=text.job_fields[:-1], param_count=text.param_count
    )
    with pytest.raises(RuntimeError, match="parameters"):
        _statement(request, catalog, "w.1", KEY_STEP)


def test_each_shape_keeps_its_own_text(catalog):
    """Requests of every shape in turn, the kept texts never cleared: each
    statement is the one built afresh for it (a shape that left out what its
    text depends on would be given another shape's text)."""
    free = CatalogModel.objects.create(
        **{**REFERENCE_MODEL, "id": "free-model", "price_completion_nano": 0}
    )
    services._open_texts.clear()
    shapes = list(
        itertools.product(
            (Job.Endpoint.CHAT, Job.Endpoint.COMPLETION),
            (False, True),
            (catalog, free),
            ("", "w.1"),
            (KEY_STEP, ONE_TRIP),
        )
    )
    for _ in range(2):  # the second time round, every text is a kept one
        for endpoint, stream, model, waiting, renter in shapes:
            request = _request(endpoint, stream)
            kept = services._open_texts
            services._open_texts = {}
            try:
                fresh, fresh_sql, fresh_params = _statement(
                    request, model, waiting, renter
                )
            finally:
                services._open_texts = kept
            step, sql, params = _statement(request, model, waiting, renter)
            assert sql == fresh_sql
            assert _comparable(step, params) == _comparable(fresh, fresh_params)
    assert len(services._open_texts) == len(shapes)
