"""Renters pay for the output tokens they received, once per job (DESIGN.md "Money")."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import Account, Earning, Entry, LedgerTransaction, ReceiptCheck
from billing.selectors import device_flags, renter_balance_nano, transactions_unbalanced
from billing.services import Segment, charge_plan, charge_post
from jobs.models import Attempt, Job
from jobs.tokens import token_count
from tests.billing.helpers import PLATFORM, balance, charge_of
from tests.hostsim import MODEL

pytestmark = pytest.mark.django_db


def test_it_charges_delivered_output_tokens_at_the_model_price(rig, renter):
    """5 tokens × 333 nano-USD = 1665 charged; host 80 % rounded down = 1332; platform 333."""
    before = renter_balance_nano(user=renter)
    job = rig.job(renter=renter, model="test-13b")
    attempt = rig.segment(job, text="Hello there, friend", tokens=5)
    job = rig.finish(job)
    assert (job.tokens_billed, job.cost_nano) == (5, 1665)
    assert renter_balance_nano(user=renter) == before - 1665
    owner = attempt.device.machine.owner
    assert balance(Account.Kind.HOST_HELD, owner) == 1332
    assert balance(PLATFORM) == 333
    txn = LedgerTransaction.objects.get(kind=LedgerTransaction.Kind.CHARGE, job=job)
    assert sum(e.amount_nano for e in txn.entries.all()) == 0
    assert txn.leg_count == 3


def test_it_counts_tokens_with_the_reference_tokenizer(rig, renter):
    """The reference model at 200 nano-USD per token: billed = the tokenizer's count."""
    text = "The capital of France is Paris."
    tokens = token_count(MODEL, text)
    job = rig.job(renter=renter, model=MODEL)
    rig.segment(job, text=text, tokens=tokens)
    job = rig.finish(job)
    assert job.tokens_billed == tokens
    assert job.cost_nano == tokens * 200


def test_it_charges_nothing_for_a_job_that_failed_before_output(rig, renter):
    before = renter_balance_nano(user=renter)
    job = rig.job(renter=renter, model="test-13b")
    for outcome in (
        Attempt.Outcome.CLAIM_TIMEOUT,
        Attempt.Outcome.FIRST_TOKEN_TIMEOUT,
        Attempt.Outcome.HOST_ERROR,
    ):
        rig.segment(job, text="", outcome=outcome)
    job = rig.finish(job, status=Job.Status.FAILED)
    assert (job.tokens_billed, job.cost_nano) == (0, 0)
    assert renter_balance_nano(user=renter) == before
    assert not LedgerTransaction.objects.filter(job=job).exists()


def test_it_charges_what_was_received_when_the_host_died_midway(rig, renter):
    """No ``done``: the reference tokenizer recounts the text received; no receipt, no pay."""
    text = "Once upon a time there"
    job = rig.job(renter=renter, model=MODEL)
    attempt = rig.segment(job, text=text, outcome=Attempt.Outcome.DIED_MIDSTREAM)
    job = rig.finish(job, status=Job.Status.FAILED)
    tokens = token_count(MODEL, text)
    assert (job.tokens_billed, job.cost_nano) == (tokens, tokens * 200)
    assert not Earning.objects.filter(attempt=attempt).exists()
    assert balance(PLATFORM) == tokens * 200


def test_it_bills_only_the_new_tokens_of_a_continuation(rig, renter):
    """Segment 1 died after 9 characters (test-13b has no tokenizer and no count was
    reported, so the characters are the count); the continuation reports its own 6."""
    job = rig.job(renter=renter, model="test-13b")
    first = rig.segment(job, text="Once upon", outcome=Attempt.Outcome.DIED_MIDSTREAM)
    second = rig.segment(
        job, text=" a time, the end.", tokens=6, continue_from="Once upon"
    )
    job = rig.finish(job)
    assert second.kind == Attempt.Kind.CONTINUATION
    assert (first.tokens_billed, second.tokens_billed) == (9, 6)
    assert (job.tokens_billed, job.cost_nano) == (15, 15 * 333)
    # only the continuation had a receipt: 80 % of 6 × 333 = 1598.4 → 1598
    assert [e.amount_nano for e in Earning.objects.filter(attempt__job=job)] == [1598]
    assert balance(PLATFORM) == 15 * 333 - 1598
    assert job.failed_over


def test_it_never_bills_the_prompt(rig, renter):
    """The model has a prompt price (50) and the host reports 10 prompt tokens: not billed."""
    job = rig.job(renter=renter, model="test-13b")
    rig.segment(job, text="abcdef", tokens=3)
    job = rig.finish(job)
    assert job.prompt_tokens == 10
    assert job.cost_nano == 3 * 333


def test_a_spot_check_bills_nobody_and_pays_its_host_like_a_job(rig, renter):
    """DESIGN.md "Spot checks": paid to the host like a job, by the platform."""
    before = renter_balance_nano(user=renter)
    job = rig.job(renter=renter, model="test-13b", spot_check=True)
    attempt = rig.segment(job, text="Paris", tokens=2)
    job = rig.finish(job)
    assert job.cost_nano == 0 and job.tokens_billed == 2
    assert renter_balance_nano(user=renter) == before
    earning = Earning.objects.get(attempt=attempt)
    real = rig.job(renter=renter, model="test-13b")
    twin = rig.segment(real, text="Paris", tokens=2)
    rig.finish(real)
    assert earning.amount_nano == Earning.objects.get(attempt=twin).amount_nano > 0
    assert earning.status == "held"
    txn = LedgerTransaction.objects.get(job=job)
    assert txn.kind == "charge" and txn.memo == "2 tokens of test-13b"
    assert {(e.account.kind, e.amount_nano) for e in txn.entries.all()} == {
        ("host_held", earning.amount_nano),
        ("platform_checks", -earning.amount_nano),
    }
    assert transactions_unbalanced() == []


def test_a_spot_check_without_a_valid_receipt_pays_nothing(rig, renter):
    job = rig.job(renter=renter, model="test-13b", spot_check=True)
    rig.segment(job, text="Paris", tokens=2, receipt="missing")
    job = rig.finish(job)
    assert not LedgerTransaction.objects.filter(job=job).exists()


def test_it_caps_an_unbelievable_count_at_the_characters_and_flags_it(rig, renter):
    """50 tokens reported for 7 characters: billed 7, attempt and device flagged, host unpaid."""
    job = rig.job(renter=renter, model="test-13b")
    attempt = rig.segment(job, text="abc def", tokens=50)
    job = rig.finish(job)
    attempt.refresh_from_db()
    assert attempt.token_count_flagged and attempt.tokens_billed == 7
    assert job.cost_nano == 7 * 333
    assert device_flags(device_id=attempt.device_id).token_count == 1
    assert not Earning.objects.filter(attempt=attempt).exists()


def test_it_flags_a_count_far_from_the_reference_recount(rig, renter):
    text = "The quick brown fox jumps over the lazy dog again and again."
    recount = token_count(MODEL, text)
    job = rig.job(renter=renter, model=MODEL, temperature=0)
    attempt = rig.segment(job, text=text, tokens=recount * 2)
    rig.finish(job)
    attempt.refresh_from_db()
    assert attempt.token_count_flagged and attempt.tokens_billed == recount


def test_a_sampled_count_is_billed_at_the_recount_but_not_flagged(rig, renter):
    """Above T 0 an honest sampler may draw finer splits than the recount
    (jobs.tokens.CANONICAL_MAX_TEMPERATURE): not a cheat's mark; the bill is
    the recount all the same, so a higher count gains nothing."""
    text = "The quick brown fox jumps over the lazy dog again and again."
    recount = token_count(MODEL, text)
    job = rig.job(renter=renter, model=MODEL, temperature=0.7)
    attempt = rig.segment(job, text=text, tokens=recount * 2)
    rig.finish(job)
    attempt.refresh_from_db()
    assert not attempt.token_count_flagged and attempt.tokens_billed == recount


def test_it_rechecks_token_sanity_before_charging(rig, renter):
    """A segment whose stored count exceeds its characters is capped and flagged by the charge."""
    job = rig.job(renter=renter, model="test-13b")
    attempt = rig.segment(job, text="abcd", tokens=2)
    Attempt.objects.filter(id=attempt.id).update(tokens_billed=99)
    job = rig.finish(job)
    attempt.refresh_from_db()
    assert (attempt.tokens_billed, attempt.token_count_flagged) == (4, True)
    assert (job.tokens_billed, job.cost_nano) == (4, 4 * 333)


def test_it_charges_a_job_once_whatever_is_retried(rig, renter):
    """A second job_finish, charge_post or late done changes nothing."""
    from jobs.services import attempt_end, job_finish

    job = rig.job(renter=renter, model="test-13b")
    attempt = rig.segment(job, text="hello world", tokens=3)
    job = rig.finish(job)
    before = renter_balance_nano(user=renter)
    again = job_finish(
        job_id=str(job.id), status=Job.Status.FAILED, output_text="x", now=rig.now
    )
    assert again.status == Job.Status.SUCCEEDED
    assert charge_post(**charge_of(job)) is None
    late = attempt_end(
        attempt_id=str(attempt.id),
        outcome=Attempt.Outcome.SUCCEEDED,
        output_text="hello world",
        done={
            "finish_reason": "stop",
            "prompt_tokens": 1,
            "completion_tokens": 3,
            "receipt": attempt.receipt,
        },
    )
    assert late is None
    assert renter_balance_nano(user=renter) == before
    assert (
        LedgerTransaction.objects.filter(
            job=job, kind=LedgerTransaction.Kind.CHARGE
        ).count()
        == 1
    )
    assert Earning.objects.filter(attempt__job=job).count() == 1


def segments_of(rig, renter, owners=("a", "b")) -> tuple[Job, list[Segment]]:
    """An open job with one receipted 5-token segment (20 characters) per owner."""
    job = rig.job(renter=renter, model="test-13b")
    segments = []
    for name in owners:
        host = next(h for h in rig.hosts.values() if h.machine.name == name)
        attempt, _ = rig.attempt(job, device=host.device)
        segments.append(
            Segment(
                attempt_id=attempt.id,
                device_id=host.device.id,
                host_id=host.machine.owner_id,
                tokens_billed=5,
                output_chars=20,
                token_count_flagged=False,
                receipt_valid=True,
                verdict=ReceiptCheck.Verdict.VALID,
            )
        )
    return job, segments


def test_it_posts_the_renter_each_paid_host_and_the_platform_once(rig, renter):
    """10 tokens × 333 = 3330: each host 80 % of 1665 = 1332 held, platform 666."""
    job, segments = segments_of(rig, renter)
    plan = charge_plan(segments=segments, max_tokens=None, price=333)
    now = timezone.now()
    kwargs = dict(job_id=job.id, renter=renter, model_id="test-13b", plan=plan, now=now)
    before = renter_balance_nano(user=renter)
    txn = charge_post(**kwargs)
    assert (txn.kind, txn.key, txn.job_id, txn.memo, txn.leg_count) == (
        LedgerTransaction.Kind.CHARGE,
        f"charge:{job.id}",
        job.id,
        "10 tokens of test-13b",
        4,
    )
    legs = list(
        Entry.objects.filter(transaction=txn)
        .order_by("id")
        .values_list("account__kind", "account__user_id", "amount_nano")
    )
    owners = [s.host_id for s in segments]
    assert legs == [
        (Account.Kind.RENTER_CREDIT, renter.id, -3330),
        (Account.Kind.HOST_HELD, owners[0], 1332),
        (Account.Kind.HOST_HELD, owners[1], 1332),
        (Account.Kind.PLATFORM, None, 666),
    ]
    earnings = list(Earning.objects.order_by("id"))
    assert [
        (e.attempt_id, e.device_id, e.host_id, e.amount_nano, e.status)
        for e in earnings
    ] == [
        (s.attempt_id, s.device_id, s.host_id, 1332, Earning.Status.HELD)
        for s in segments
    ]
    assert {e.release_at for e in earnings} == {now + timedelta(hours=24)}
    assert renter_balance_nano(user=renter) == before - 3330
    assert transactions_unbalanced() == []

    assert charge_post(**kwargs) is None, "one job is never charged twice"
    assert Entry.objects.filter(transaction__job_id=job.id).count() == 4
    assert Earning.objects.count() == 2
    assert renter_balance_nano(user=renter) == before - 3330


def test_it_drops_a_zero_leg(rig, renter, settings):
    """The host's share is the whole cost: the platform's leg (0) is not written."""
    settings.BALLAST_HOST_SHARE = Decimal("1")
    job, segments = segments_of(rig, renter, owners=("a",))
    plan = charge_plan(segments=segments, max_tokens=None, price=333)
    assert plan.platform == 0
    txn = charge_post(
        job_id=job.id, renter=renter, model_id="test-13b", plan=plan, now=rig.now
    )
    assert txn.leg_count == 2
    assert sorted(txn.entries.values_list("amount_nano", flat=True)) == [-1665, 1665]


def test_it_posts_nothing_for_a_zero_cost(rig, renter):
    job, segments = segments_of(rig, renter, owners=("a",))
    plan = charge_plan(segments=segments, max_tokens=None, price=0)
    assert plan.cost == 0
    assert (
        charge_post(
            job_id=job.id, renter=renter, model_id="test-13b", plan=plan, now=rig.now
        )
        is None
    )
    assert not LedgerTransaction.objects.filter(job=job).exists()
    assert not Earning.objects.exists()


def test_it_pays_only_believed_receipted_segments(rig, renter):
    """Segments with a replayed receipt, with a flagged count, and believed: the renter
    pays all 15 tokens, only the last one's host is paid (80 % of its 5)."""
    job, segments = segments_of(rig, renter, owners=("a", "b", "c"))
    segments[0].verdict = ReceiptCheck.Verdict.REPLAYED
    segments[0].receipt_valid = False
    segments[1].token_count_flagged = True
    plan = charge_plan(segments=segments, max_tokens=None, price=333)
    txn = charge_post(
        job_id=job.id, renter=renter, model_id="test-13b", plan=plan, now=rig.now
    )
    assert sorted(txn.entries.values_list("amount_nano", flat=True)) == [
        -4995,
        1332,
        3663,
    ]
    assert list(Earning.objects.values_list("attempt_id", flat=True)) == [
        segments[2].attempt_id
    ]
