"""``max_tokens`` is bounded by the model's own context (issue 35: not "from 1
to 8192" for a model whose context is 2,048): a budget that leaves no room for
any prompt is a 400 quoting this model's bound, naming ``max_tokens``."""

from __future__ import annotations

import pytest

from catalog.models import CatalogModel
from jobs.errors import ApiError
from tests.jobs.helpers import key_of, open_job


@pytest.mark.django_db
def test_a_budget_past_the_model_s_context_quotes_its_bound(renter, catalog):
    CatalogModel.objects.filter(id=catalog.id).update(context_length=2048)
    key = key_of(renter)
    for budget in (2048, 5000):
        with pytest.raises(ApiError) as refused:
            open_job(key, max_tokens=budget)
        error = refused.value
        assert error.status == 400 and error.param == "max_tokens"
        assert "from 1 to 2047" in error.message and "8192" not in error.message
    job, _, _ = open_job(key, max_tokens=2000)  # a short prompt fits beside it
    assert job.params["max_tokens"] == 2000
