"""``canary_calibrate`` against the real reference model (no mocks)."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from jobs.canaries import CANDIDATES, answer_appears
from jobs.models import CanaryPrompt

pytestmark = pytest.mark.django_db


def test_it_keeps_only_the_prompts_the_reference_model_answers_right(catalog):
    out = io.StringIO()
    call_command("canary_calibrate", catalog.id, "--limit", "6", stdout=out)
    rows = list(CanaryPrompt.objects.filter(model_id=catalog.id))
    assert len(rows) == 6
    assert {r.prompt for r in rows} == {p for p, _ in CANDIDATES[:6]}
    for row in rows:
        assert row.calibrated == answer_appears(row.expected, row.reference_output)
    kept = [r for r in rows if r.calibrated]
    assert kept, "the reference model answers some canaries right"
    assert any(not r.calibrated for r in rows) or len(kept) == 6
    what_is_2_plus_2 = CanaryPrompt.objects.get(prompt="What is 2+2?")
    assert what_is_2_plus_2.calibrated, "SmolLM2 answers 4 at temperature 0"
    assert f"{len(kept)} of 6 canaries calibrated" in out.getvalue()


def test_it_refuses_a_model_outside_the_catalog(catalog):
    with pytest.raises(CommandError, match="not in the catalog"):
        call_command("canary_calibrate", "gpt-17")
