"""Hosts earn 80 % of each receipted segment, held 24 h, reversed by a failed spot check."""

from __future__ import annotations

from datetime import timedelta

import pytest

from billing import tasks
from billing.models import Account, Earning, LedgerTransaction, ReceiptCheck
from billing.selectors import device_flags, host_balances_nano
from billing.services import earnings_reverse_held, holds_release
from jobs.models import Attempt
from tests.billing.helpers import PLATFORM, balance

pytestmark = pytest.mark.django_db


def _paid(rig, renter, *, text="abcdefghij", tokens=7, receipt="valid"):
    job = rig.job(renter=renter, model="test-13b")
    attempt = rig.segment(job, text=text, tokens=tokens, receipt=receipt)
    rig.finish(job)
    attempt.refresh_from_db()
    return attempt


def test_it_pays_80_percent_of_a_receipted_segment_rounded_down(rig, renter):
    """7 tokens × 333 = 2331; 80 % = 1864.8 → 1864 held; platform 467."""
    attempt = _paid(rig, renter)
    earning = Earning.objects.get(attempt=attempt)
    assert earning.amount_nano == 1864
    assert earning.status == Earning.Status.HELD
    assert earning.release_at == rig.now + timedelta(hours=24)
    assert balance(PLATFORM) == 2331 - 1864
    assert attempt.receipt_check.verdict == ReceiptCheck.Verdict.VALID


def test_it_follows_the_host_share_setting(rig, renter, settings):
    from decimal import Decimal

    settings.BALLAST_HOST_SHARE = Decimal("0.5")
    attempt = _paid(rig, renter)  # 2331 × 0.5 = 1165.5 → 1165
    assert Earning.objects.get(attempt=attempt).amount_nano == 1165


@pytest.mark.parametrize(
    ("receipt", "verdict"),
    [
        ("missing", ReceiptCheck.Verdict.MISSING),
        ("bad", ReceiptCheck.Verdict.INVALID),
        ("other_text", ReceiptCheck.Verdict.INVALID),
    ],
)
def test_it_pays_nothing_without_a_valid_receipt_and_flags_it(
    rig, renter, receipt, verdict
):
    """The renter is still charged what they received; the platform keeps it all."""
    attempt = _paid(rig, renter, receipt=receipt)
    assert attempt.receipt_valid is False
    assert attempt.receipt_check.verdict == verdict
    assert not Earning.objects.filter(attempt=attempt).exists()
    assert balance(PLATFORM) == 2331
    flags = device_flags(device_id=attempt.device_id)
    assert flags.total == 1


def test_it_pays_nothing_for_a_receipt_signed_by_another_key(rig, renter):
    job = rig.job(renter=renter, model="test-13b")
    attempt, host = rig.attempt(job)
    impostor = next(h for h in rig.hosts.values() if h is not host)
    from jobs.services import attempt_end

    attempt_end(
        attempt_id=str(attempt.id),
        outcome=Attempt.Outcome.SUCCEEDED,
        output_text="abc",
        done={
            "finish_reason": "stop",
            "prompt_tokens": 1,
            "completion_tokens": 2,
            "receipt": impostor.sign(str(attempt.id), 2, "abc"),
        },
        now=rig.now,
    )
    rig.finish(job)
    assert (
        ReceiptCheck.objects.get(attempt=attempt).verdict
        == ReceiptCheck.Verdict.INVALID
    )
    assert not Earning.objects.exists()


def test_it_pays_nothing_for_a_replayed_receipt(rig, renter):
    """The signature of an earlier attempt presented again is a replay: flagged, unpaid."""
    first = _paid(rig, renter, text="same text", tokens=2)
    device = first.device
    job = rig.job(renter=renter, model="test-13b")
    second = rig.segment(
        job, text="same text", tokens=2, receipt=first.receipt, device=device
    )
    rig.finish(job)
    second.refresh_from_db()
    assert second.receipt_check.verdict == ReceiptCheck.Verdict.REPLAYED
    assert second.receipt_valid is False
    assert list(Earning.objects.values_list("attempt_id", flat=True)) == [first.id]
    assert device_flags(device_id=device.id).receipt_replayed == 1


def test_it_keeps_the_first_verdict_for_a_second_done(rig, renter):
    from billing.services import receipt_check

    attempt = _paid(rig, renter)
    verdict = receipt_check(
        attempt_id=attempt.id,
        device_id=attempt.device_id,
        public_key_b64=attempt.device.machine.public_key,
        signature_b64="",
        completion_tokens=7,
        text="abcdefghij",
    )
    assert verdict == ReceiptCheck.Verdict.VALID
    assert ReceiptCheck.objects.filter(attempt=attempt).count() == 1


def test_it_pays_nothing_to_a_host_that_claims_and_never_delivers(rig, renter):
    job = rig.job(renter=renter, model="test-13b")
    silent = rig.segment(job, text="", outcome=Attempt.Outcome.FIRST_TOKEN_TIMEOUT)
    rig.segment(job, text="abcd", tokens=2)
    rig.finish(job)
    assert not Earning.objects.filter(device=silent.device).exists()
    assert Earning.objects.count() == 1


def test_it_releases_holds_after_24_hours(rig, renter):
    attempt = _paid(rig, renter)
    owner = attempt.device.machine.owner
    assert holds_release(now=rig.now + timedelta(hours=23, minutes=59)) == 0
    assert holds_release(now=rig.now + timedelta(hours=24)) == 1
    assert holds_release(now=rig.now + timedelta(hours=48)) == 0  # once only
    earning = Earning.objects.get(attempt=attempt)
    assert earning.status == Earning.Status.RELEASED
    assert host_balances_nano(user=owner) == {
        "held": 0,
        "available": 1864,
        "paid_out": 0,
        "reversed": 0,
        "requested": 0,
        "requestable": 1864,
    }
    release = LedgerTransaction.objects.get(kind=LedgerTransaction.Kind.HOLD_RELEASE)
    assert release.job_id == attempt.job_id


def test_it_follows_the_hold_hours_setting(rig, renter, settings):
    settings.BALLAST_HOLD_HOURS = 1
    attempt = _paid(rig, renter)
    assert Earning.objects.get(attempt=attempt).release_at == rig.now + timedelta(
        hours=1
    )


def test_it_releases_holds_from_the_beat_task(rig, renter):
    attempt = _paid(rig, renter)
    Earning.objects.filter(attempt=attempt).update(
        release_at=rig.now - timedelta(seconds=1)
    )
    assert tasks.holds_release() == 1
    assert balance(Account.Kind.HOST_AVAILABLE, attempt.device.machine.owner) == 1864


def test_it_reverses_held_earnings_of_a_device_that_failed_a_spot_check(rig, renter):
    """Held earnings of that device go to the platform; released ones and others stay."""
    old = _paid(rig, renter)
    device = old.device
    holds_release(now=rig.now + timedelta(hours=24))
    rig.advance(hours=25)
    job = rig.job(renter=renter, model="test-13b")
    held = rig.segment(job, text="abcdefghij", tokens=7, device=device)
    rig.finish(job)
    job = rig.job(renter=renter, model="test-13b")
    other = rig.segment(
        job,
        text="abcdefghij",
        tokens=7,
        device=next(h.device for h in rig.hosts.values() if h.device != device),
    )
    rig.finish(job)
    platform_before = balance(PLATFORM)

    assert (
        earnings_reverse_held(
            machine_id=device.machine_id, reason="failed spot check", now=rig.now
        )
        == 1
    )
    again = earnings_reverse_held(
        machine_id=device.machine_id, reason="again", now=rig.now
    )
    assert again == 0

    statuses = {e.attempt_id: e.status for e in Earning.objects.all()}
    assert statuses == {
        old.id: Earning.Status.RELEASED,
        held.id: Earning.Status.REVERSED,
        other.id: Earning.Status.HELD,
    }
    owner = device.machine.owner
    assert host_balances_nano(user=owner)["held"] == 0
    assert host_balances_nano(user=owner)["available"] == 1864
    assert host_balances_nano(user=owner)["reversed"] == 1864
    assert balance(PLATFORM) == platform_before + 1864
    assert (
        holds_release(now=rig.now + timedelta(hours=48)) == 1
    )  # only the other device's
