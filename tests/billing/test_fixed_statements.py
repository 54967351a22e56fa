"""Billing's fixed statements (``receipt_record``, ``charge_post``) and the raw-value
helpers of ``ballast.db``, on SQLite and PostgreSQL alike (DESIGN.md "Money")."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from ballast.db import db_datetime, db_uuid, row_fetch, value_datetime, value_uuid
from billing.models import Account, Earning, Entry, LedgerTransaction, ReceiptCheck
from billing.services import (
    Segment,
    account_for,
    charge_plan,
    charge_post,
    receipt_record,
)
from jobs.models import Attempt

pytestmark = pytest.mark.django_db

VALID = ReceiptCheck.Verdict.VALID


def attempt_made(rig, renter) -> Attempt:
    job = rig.job(renter=renter, model="test-13b")
    attempt, _ = rig.attempt(job)
    return attempt


def test_a_receipt_is_recorded_once_and_a_raced_signature_is_a_replay(rig, renter):
    first, second = attempt_made(rig, renter), attempt_made(rig, renter)
    assert (
        receipt_record(
            attempt_id=first.id,
            device_id=first.device_id,
            signature="sig",
            verdict=VALID,
        )
        == VALID
    )
    # a second done of the same attempt: the first verdict stands, nothing written
    assert (
        receipt_record(
            attempt_id=first.id,
            device_id=first.device_id,
            signature="other",
            verdict=ReceiptCheck.Verdict.INVALID,
        )
        == VALID
    )
    # the same signature for another attempt (judged valid before it was stored)
    assert (
        receipt_record(
            attempt_id=second.id,
            device_id=second.device_id,
            signature="sig",
            verdict=VALID,
        )
        == ReceiptCheck.Verdict.REPLAYED
    )
    checks = {c.attempt_id: c for c in ReceiptCheck.objects.all()}
    assert len(checks) == 2
    assert (checks[first.id].verdict, checks[first.id].signature) == (VALID, "sig")
    assert (checks[second.id].verdict, checks[second.id].signature) == (
        ReceiptCheck.Verdict.REPLAYED,
        None,
    )


def segments_of(rig, renter, owners=("a", "b")) -> list[Segment]:
    out = []
    for name in owners:
        host = next(h for h in rig.hosts.values() if h.machine.name == name)
        attempt = attempt_made(rig, renter)
        out.append(
            Segment(
                attempt_id=attempt.id,
                device_id=host.device.id,
                host_id=host.machine.owner_id,
                tokens_billed=5,
                output_chars=20,
                token_count_flagged=False,
                receipt_valid=True,
                verdict=VALID,
                held_account_id=account_for(
                    kind=Account.Kind.HOST_HELD, user=host.machine.owner
                ).id,
            )
        )
    return out


def test_a_charge_is_posted_balanced_once(rig, renter):
    segments = segments_of(rig, renter)
    job_id = Attempt.objects.get(id=segments[0].attempt_id).job_id
    plan = charge_plan(segments=segments, max_tokens=None, price=333)
    now = timezone.now()
    kwargs = dict(
        job_id=job_id,
        model_id="test-13b",
        plan=plan,
        renter_account_id=account_for(kind=Account.Kind.RENTER_CREDIT, user=renter).id,
        platform_account_id=account_for(kind=Account.Kind.PLATFORM).id,
        now=now,
    )
    txn_id = charge_post(**kwargs)
    txn = LedgerTransaction.objects.get(id=txn_id)
    assert (txn.kind, txn.key, txn.memo, txn.leg_count) == (
        LedgerTransaction.Kind.CHARGE,
        f"charge:{job_id}",
        "10 tokens of test-13b",
        4,
    )
    amounts = list(
        Entry.objects.filter(transaction=txn)
        .order_by("id")
        .values_list("amount_nano", flat=True)
    )
    assert amounts == [-3330, 1332, 1332, 666]
    earnings = list(Earning.objects.order_by("id"))
    assert [(e.attempt_id, e.amount_nano, e.status) for e in earnings] == [
        (s.attempt_id, 1332, Earning.Status.HELD) for s in segments
    ]
    assert abs(earnings[0].release_at - (now + timedelta(hours=24))) < timedelta(
        seconds=1
    )
    assert charge_post(**kwargs) is None, "one job is never charged twice"
    assert Entry.objects.filter(transaction__job_id=job_id).count() == 4
    assert Earning.objects.count() == 2


def test_a_zero_leg_is_dropped(rig, renter, settings):
    settings.BALLAST_HOST_SHARE = Decimal("1")
    segments = segments_of(rig, renter, owners=("a",))
    plan = charge_plan(segments=segments, max_tokens=None, price=333)
    assert plan.platform == 0
    txn_id = charge_post(
        job_id=Attempt.objects.get(id=segments[0].attempt_id).job_id,
        model_id="test-13b",
        plan=plan,
        renter_account_id=account_for(kind=Account.Kind.RENTER_CREDIT, user=renter).id,
        platform_account_id=account_for(kind=Account.Kind.PLATFORM).id,
        now=timezone.now(),
    )
    assert LedgerTransaction.objects.get(id=txn_id).leg_count == 2
    assert Entry.objects.filter(transaction_id=txn_id).count() == 2


def test_raw_values_come_back_as_the_orm_gives_them(rig, renter):
    attempt = attempt_made(rig, renter)
    row = row_fetch(
        "SELECT id, offered_at FROM jobs_attempt WHERE id = %s AND offered_at = %s",
        [db_uuid(str(attempt.id)), db_datetime(attempt.offered_at)],
    )
    assert row is not None
    assert value_uuid(row[0]) == attempt.id
    assert value_datetime(row[1]) == attempt.offered_at
    assert value_datetime(row[1]).utcoffset() == timedelta(0)
