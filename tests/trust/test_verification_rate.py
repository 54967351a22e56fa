"""How often a device's answers are verified (trust/verification/rate.py;
DESIGN.md "Verifying real answers"): the base rate, raised for a device's first
jobs and after a failed check, the suspicion decaying as checks pass; the draw
honours the rate."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from hosts.models import DeviceOutcome
from hosts.services import machine_create
from jobs.models import Attempt, Job, Verification
from tests.devices import device_online
from tests.hostsim import MODEL
from trust.verification.rate import (
    verification_draw,
    verification_due,
    verification_rate,
)
from trust.verification.records import verification_choose

pytestmark = pytest.mark.django_db


@pytest.fixture
def rates(settings, catalog):
    settings.BALLAST_VERIFY_RATE = 0.05
    settings.BALLAST_VERIFY_NEW_JOBS = 20
    settings.BALLAST_VERIFY_NEW_RATE = 0.5
    settings.BALLAST_VERIFY_SUSPECT_RATE = 0.5
    settings.BALLAST_VERIFY_SUSPECT_PASSES = 5
    return settings


def _device(email="a@example.com", name="a", **kw):
    machine, _ = machine_create(owner_email=email, name=name)
    return device_online(machine, **kw)


def _jobs(device, renter, count: int) -> list[tuple[Job, Attempt]]:
    """``count`` renters' jobs that succeeded on ``device`` in one fresh attempt."""
    now = timezone.now()
    jobs = Job.objects.bulk_create(
        [
            Job(
                renter=renter,
                model_id=MODEL,
                endpoint="chat",
                messages=[{"role": "user", "content": "hi"}],
                params={"max_tokens": 8, "temperature": 0.7},
                status=Job.Status.SUCCEEDED,
                output_text="Hello!",
                tokens_billed=2,
            )
            for _ in range(count)
        ]
    )
    attempts = Attempt.objects.bulk_create(
        [
            Attempt(
                job=job,
                device=device,
                state=Attempt.State.ENDED,
                outcome=Attempt.Outcome.SUCCEEDED,
                claim_deadline=now,
                output_text="Hello!",
                output_chars=6,
                tokens_billed=2,
            )
            for job in jobs
        ]
    )
    return list(zip(jobs, attempts))


def _checks(device, *, success: bool, count: int = 1, at=None) -> None:
    for _ in range(count):
        DeviceOutcome.objects.create(
            device=device, source=DeviceOutcome.Source.SPOT_CHECK, success=success
        )
        if at is not None:
            DeviceOutcome.objects.filter(device=device).order_by("-id").update(
                created_at=at
            )


def test_a_new_device_is_verified_more_over_its_first_jobs_then_less(rates, renter):
    device = _device()
    assert verification_rate(device_id=device.id) == 0.5
    _jobs(device, renter, 20)
    assert verification_rate(device_id=device.id) == 0.5, "its first 20 jobs"
    _jobs(device, renter, 20)
    assert verification_rate(device_id=device.id) == pytest.approx(0.25)
    _jobs(device, renter, 160)
    assert verification_rate(device_id=device.id) == 0.05, "then the base rate"
    spot_check = Job.objects.create(
        model_id=MODEL, endpoint="chat", is_spot_check=True, status="succeeded"
    )
    other = _device("b@example.com", "b")
    Attempt.objects.create(
        job=spot_check,
        device=other,
        state="ended",
        outcome="succeeded",
        claim_deadline=timezone.now(),
    )
    assert verification_rate(device_id=other.id) == 0.5, "spot checks are not jobs"


def test_suspicion_after_a_failed_check_decays_as_checks_pass(rates, renter):
    device = _device()
    _jobs(device, renter, 400)
    assert verification_rate(device_id=device.id) == 0.05
    past = timezone.now() - timedelta(hours=1)
    _checks(device, success=False, at=past)
    assert verification_rate(device_id=device.id) == 0.5, "a failed check"
    _checks(device, success=True, count=5)
    assert verification_rate(device_id=device.id) == pytest.approx(0.25)
    for trusted in (False, True):
        job, attempt = _jobs(device, renter, 1)[0]
        Verification.objects.create(
            job=job,
            attempt=attempt,
            device=device,
            status="scored",
            verdict="plausible",
            verifier_trusted=trusted,
            scored_at=timezone.now(),
        )
    # only the trusted verifier's plausible verdict counts as a pass
    assert verification_rate(device_id=device.id) == pytest.approx(0.5 * 0.5 ** 1.2)
    _checks(device, success=True, count=30)
    assert verification_rate(device_id=device.id) == 0.05, "back to the base"


def test_the_draw_honours_the_rate(rates, renter):
    rates.BALLAST_VERIFY_RATE = 0.25
    rates.BALLAST_VERIFY_NEW_RATE = 0.0
    device = _device()
    pairs = _jobs(device, renter, 400)
    now = timezone.now()
    chosen = sum(
        verification_choose(job=job, attempts=[attempt], now=now) is not None
        for job, attempt in pairs
    )
    # 400 draws at 0.25: 100 ± 8.7 (one sigma); 5 sigmas either side
    assert 56 <= chosen <= 144, chosen
    assert Verification.objects.filter(status="no_verifier").count() == chosen
    draws = [verification_draw() for _ in range(20000)]
    assert all(0 <= d < 1 for d in draws)
    assert abs(sum(draws) / len(draws) - 0.5) < 0.02


def test_only_a_renters_answer_in_one_attempt_is_chosen_formatted_too(rates, renter):
    rates.BALLAST_VERIFY_RATE = 1.0
    device = _device()
    (job, attempt), (cont, cont_attempt), (formatted, f_attempt), (empty, e_attempt) = (
        _jobs(device, renter, 4)
    )
    now = timezone.now()
    assert verification_choose(job=job, attempts=[attempt], now=now) is not None
    cont_attempt.kind = Attempt.Kind.CONTINUATION
    assert verification_choose(job=cont, attempts=[cont_attempt], now=now) is None
    assert verification_choose(job=cont, attempts=[attempt, cont_attempt], now=now) is None
    formatted.params = {**formatted.params, "response_format": '{"type": "json_object"}'}
    # under a grammar, with the host's ids or (left out) as its text: never spared
    assert verification_choose(job=formatted, attempts=[f_attempt], now=now) is not None
    # between 0 and 0.5 with or without ids (the support judges it); above 1
    # only with the host's ids (its text tokenized again strays too often)
    (cool, cool_attempt), (hot, hot_attempt) = _jobs(device, renter, 2)
    cool.params = {**cool.params, "temperature": 0.3}
    assert verification_choose(job=cool, attempts=[cool_attempt], now=now) is not None
    hot.params = {**hot.params, "temperature": 1.5}
    assert verification_choose(job=hot, attempts=[hot_attempt], now=now) is None
    hot_attempt.verify_token_ids = [1, 2]
    assert verification_choose(job=hot, attempts=[hot_attempt], now=now) is not None
    empty.output_text = ""
    assert verification_choose(job=empty, attempts=[e_attempt], now=now) is None
    job.is_spot_check = True
    assert verification_choose(job=job, attempts=[attempt], now=now) is None


def test_a_draw_is_due_exactly_under_the_rate(rates, renter):
    """``verification_due`` (which skips the queries a draw does not need) is
    ``draw < verification_rate``, whatever the device's history."""
    fresh = _device()
    old = _device("b@example.com", "b")
    _jobs(old, renter, 30)
    suspect = _device("c@example.com", "c")
    _jobs(suspect, renter, 400)
    _checks(suspect, success=False, at=timezone.now() - timedelta(hours=1))
    _checks(suspect, success=True, count=3)
    for device in (fresh, old, suspect):
        rate = verification_rate(device_id=device.id)
        for draw in (0.0, 0.04, 0.049, 0.3, rate - 1e-9, rate, 0.49, 0.5, 0.9):
            assert verification_due(device_id=device.id, draw=draw) is (draw < rate)


def test_most_draws_read_one_statement(rates, renter, django_assert_num_queries):
    """A draw reads the device's counts (its exempt answers and real jobs) in
    one statement, and the suspicion part in a second only when the draw is
    under its ceiling and no part before it verified (issue 34: every job's
    end makes this draw)."""
    device = _device()
    _jobs(device, renter, 100)  # past its new-device span: 0.5 × 0.5⁴
    with django_assert_num_queries(1):
        assert not verification_due(device_id=device.id, draw=0.9)
    with django_assert_num_queries(1):
        assert verification_due(device_id=device.id, draw=0.01)
    with django_assert_num_queries(2):
        assert not verification_due(device_id=device.id, draw=0.3)
    _checks(device, success=False)
    with django_assert_num_queries(2):
        assert verification_due(device_id=device.id, draw=0.3)
