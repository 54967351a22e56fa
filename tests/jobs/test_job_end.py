"""The end of a successful job (DESIGN.md "How a request flows" step 6, "Money",
"Reliability score"): ``job_succeed`` records the job, its attempts, receipt
checks, outcomes, scores, ledger entries and earnings of each scenario exactly
as the two ways it replaced did.

``job_end_rows.json`` holds those rows as the fixed statements and the general
way both wrote them (recorded from the commit before the two became one, on
SQLite and PostgreSQL alike: the same), with ids, keys and times replaced by
what they stand for; since then, an inflated count is also a failed check of the
device's honesty (its outcome and score in the two scenarios that inflate).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from billing.models import Account, Earning, Entry, LedgerTransaction, ReceiptCheck
from hosts.models import Device, DeviceModel, DeviceOutcome
from jobs import services
from jobs.models import Attempt, Job
from jobs.tokens import token_count
from tests.billing.helpers import Rig, untokenized_model
from tests.hostsim import MODEL

pytestmark = pytest.mark.django_db

TEXT = "The capital of France is Paris."
UNTOKENIZED = "test-13b"

# steps: (outcome, text, reported tokens, receipt) per attempt, the last succeeds
SCENARIOS = {
    "one attempt": dict(steps=[("ok", TEXT, None, "valid")]),
    "after a failure before output": dict(
        steps=[
            (Attempt.Outcome.FIRST_TOKEN_TIMEOUT, "", None, None),
            ("ok", TEXT, None, "valid"),
        ]
    ),
    "a continuation": dict(
        steps=[
            (Attempt.Outcome.DIED_MIDSTREAM, "The capital of ", None, None),
            ("ok", "France is Paris.", None, "valid"),
        ]
    ),
    "an invalid receipt": dict(steps=[("ok", TEXT, None, "other_text")]),
    "a missing receipt": dict(steps=[("ok", TEXT, None, "missing")]),
    "an unbelievable count": dict(steps=[("ok", TEXT, 40, "valid")]),
    "over max_tokens": dict(steps=[("ok", TEXT, None, "valid")], max_tokens=3),
    "no tokenizer, more tokens than characters": dict(
        steps=[("ok", "Hi!", 9, "valid")], model=UNTOKENIZED
    ),
    "a replayed signature": dict(steps=[("ok", TEXT, None, "replay")]),
}


@pytest.fixture
def worlds(catalog, renter, settings):
    """Two rigs of two hosts each (their own owners), both serving both models."""
    settings.BALLAST_SPOT_CHECKS = False
    untokenized_model()
    made = []
    for tag in ("one", "two"):
        rig = Rig(models=[MODEL, UNTOKENIZED])
        hosts = [rig.host_add(f"{tag}-{i}") for i in range(2)]
        made.append((rig, hosts))
    return made


def play(rig, hosts, renter, scenario: dict, *, replay_of: str = ""):
    """Play ``scenario`` on ``hosts`` and end it with ``services.job_succeed``."""
    model = scenario.get("model", MODEL)
    job = rig.job(renter=renter, model=model, max_tokens=scenario.get("max_tokens", 64))
    delivered = ""
    *before, last = scenario["steps"]
    for i, (outcome, text, _, _) in enumerate(before):
        rig.segment(
            job,
            text=text,
            outcome=outcome,
            continue_from=delivered,
            device=hosts[i].device,
        )
        delivered += text
    _, text, reported, receipt = last
    attempt, host = rig.attempt(
        job, continue_from=delivered, device=hosts[len(before)].device
    )
    tokens = reported if reported is not None else token_count(model, text)
    done = {
        "finish_reason": "stop",
        "prompt_tokens": 10,
        "completion_tokens": tokens,
        "receipt": replay_of
        if receipt == "replay"
        else rig.receipt_for(host, attempt, tokens, text, receipt),
    }
    kwargs = dict(
        job_id=str(job.id),
        attempt_id=str(attempt.id),
        segment_text=text,
        done=done,
        answer_text=delivered + text,
        claimed_at=attempt.offered_at + timedelta(milliseconds=40),
        first_token_at=attempt.offered_at + timedelta(milliseconds=150),
    )
    return job, services.job_succeed(**kwargs), done["receipt"]


def end_with_text(job: Job, attempt, *, tokens: int, receipt: str, **extra):
    """``services.job_succeed`` of ``attempt``, the job's only one, having sent
    ``TEXT``; what it returns."""
    return services.job_succeed(
        job_id=str(job.id),
        attempt_id=str(attempt.id),
        segment_text=TEXT,
        done={
            "finish_reason": "stop",
            "prompt_tokens": 10,
            "completion_tokens": tokens,
            "receipt": receipt,
        },
        answer_text=TEXT,
        **extra,
    )


def recorded(job: Job, ended: Job, hosts) -> dict:
    """What the end of ``job`` recorded, with ids and times by what they stand for."""
    job.refresh_from_db()
    devices = {h.device.id: i for i, h in enumerate(hosts)}
    owners = {h.machine.owner_id: f"host {i}" for i, h in enumerate(hosts)}
    attempts = list(job.attempts.order_by("offered_at", "id"))
    index = {a.id: i for i, a in enumerate(attempts)}
    txn = LedgerTransaction.objects.filter(job=job).first()
    return {
        "returned": (
            ended.status,
            ended.finish_reason,
            ended.prompt_tokens,
            ended.tokens_billed,
            ended.cost_nano,
        ),
        "job": (
            job.status,
            job.output_text,
            job.finish_reason,
            job.error_code,
            job.error_message,
            job.tokens_billed,
            job.cost_nano,
            job.prompt_tokens,
            job.failed_over,
            job.finished_at is not None,
        ),
        "attempts": [
            (
                devices[a.device_id],
                a.kind,
                a.state,
                a.outcome,
                a.error_message,
                a.output_text,
                a.output_chars,
                a.completion_tokens_reported,
                a.prompt_tokens_reported,
                a.tokens_billed,
                bool(a.receipt),
                a.receipt_valid,
                a.token_count_flagged,
                a.ended_at is not None,
                a.claimed_at is not None,
                # set by the test for the last attempt; real time for the others
                a.ttft_ms if a.outcome == Attempt.Outcome.SUCCEEDED else None,
            )
            for a in attempts
        ],
        "receipts": [
            (index[r.attempt_id], devices[r.device_id], r.verdict, r.signature is None)
            for r in ReceiptCheck.objects.filter(attempt__job=job).order_by(
                "attempt__offered_at"
            )
        ],
        "outcomes": sorted(
            (devices[o.device_id], o.source, o.success, o.reason, o.model_id, o.ttft_ms)
            for o in DeviceOutcome.objects.filter(device_id__in=devices)
        ),
        "devices": [
            (
                d.score,
                d.slots_used,
                d.quarantined,
                sorted(
                    DeviceModel.objects.filter(device=d).values_list(
                        "model_id", "ttft_ms_recent", "score"
                    )
                ),
            )
            for d in Device.objects.filter(id__in=devices).order_by("id")
        ],
        "ledger": txn
        and (
            txn.kind,
            txn.key == f"charge:{job.id}",
            txn.memo,
            txn.leg_count,
            [
                (
                    e.account.kind,
                    owners.get(
                        e.account.user_id, "renter" if e.account.user_id else None
                    ),
                    e.amount_nano,
                )
                for e in Entry.objects.filter(transaction=txn)
                .select_related("account")
                .order_by("id")
            ],
        ),
        "earnings": [
            (
                index[e.attempt_id],
                devices[e.device_id],
                owners[e.host_id],
                e.amount_nano,
                e.status,
                abs((e.release_at - job.finished_at) - timedelta(hours=24))
                < timedelta(seconds=5),
            )
            for e in Earning.objects.filter(attempt__job=job).order_by("id")
        ],
    }


RECORDED = json.loads((Path(__file__).parent / "job_end_rows.json").read_text())


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_end_records_what_the_two_ways_before_it_recorded(name, worlds, renter):
    scenario = SCENARIOS[name]
    rig, hosts = worlds[0]
    replay_of = ""
    if any(step[3] == "replay" for step in scenario["steps"]):
        # a receipt already presented for another attempt of this world
        _, _, replay_of = play(rig, hosts, renter, SCENARIOS["one attempt"])
    job, ended, _ = play(rig, hosts, renter, scenario, replay_of=replay_of)
    rows = json.loads(json.dumps(recorded(job, ended, hosts), default=str))
    assert rows == RECORDED[name]
    assert rows["job"][0] == Job.Status.SUCCEEDED


def test_a_spot_check_bills_nobody_and_its_end_records_no_outcome(worlds):
    """A spot check's outcome is its verdict (``spotchecks.spot_check_judge``);
    its host is paid like a job's, by the platform (nobody billed)."""
    rig, hosts = worlds[0]
    job = rig.job(renter=None, model=MODEL, spot_check=True)
    attempt, host = rig.attempt(job, device=hosts[0].device)
    tokens = token_count(MODEL, TEXT)
    ended = end_with_text(
        job, attempt, tokens=tokens, receipt=host.sign(str(attempt.id), tokens, TEXT)
    )
    assert (ended.status, ended.cost_nano) == (Job.Status.SUCCEEDED, 0)
    assert not DeviceOutcome.objects.filter(device=hosts[0].device).exists()
    kinds = {
        e.account.kind
        for e in Entry.objects.filter(transaction__job=job).select_related("account")
    }
    assert kinds == {"platform_checks", "host_held"}
    assert Earning.objects.get(attempt=attempt).status == "held"


def test_a_second_end_of_the_same_job_changes_nothing(worlds, renter):
    """A late second ``done``: the attempt and job are closed, nothing is charged twice."""
    rig, hosts = worlds[0]
    job, ended, receipt = play(rig, hosts, renter, SCENARIOS["one attempt"])
    attempt = job.attempts.get()
    before = (
        Entry.objects.count(),
        Earning.objects.count(),
        DeviceOutcome.objects.count(),
        Device.objects.get(id=hosts[0].device.id).slots_used,
    )
    again = end_with_text(
        job, attempt, tokens=attempt.completion_tokens_reported, receipt=receipt
    )
    assert (again.tokens_billed, again.cost_nano) == (
        ended.tokens_billed,
        ended.cost_nano,
    )
    assert before == (
        Entry.objects.count(),
        Earning.objects.count(),
        DeviceOutcome.objects.count(),
        Device.objects.get(id=hosts[0].device.id).slots_used,
    )
    assert Account.objects.filter(kind=Account.Kind.HOST_HELD).count() == 1


@pytest.mark.parametrize(
    "over, billed_is, flagged",
    [(-1, "reported", False), (0, "recount", False), (2, "recount", False)],
    ids=["under the recount", "the recount", "within the tolerance above it"],
)
def test_a_count_is_never_billed_above_the_recount(
    worlds, renter, over, billed_is, flagged
):
    """DESIGN.md "Money": billed = min(reported, recount) where the coordinator
    has the model's tokenizer; a count within the tolerance above the recount is
    billed as the recount and not flagged."""
    recount = token_count(MODEL, TEXT)
    rig, hosts = worlds[0]
    scenario = dict(steps=[("ok", TEXT, recount + over, "valid")])
    job, ended, _ = play(rig, hosts, renter, scenario)
    attempt = job.attempts.get()
    expected = recount + over if billed_is == "reported" else recount
    assert (attempt.tokens_billed, ended.tokens_billed) == (expected, expected)
    assert attempt.token_count_flagged is flagged
    assert not DeviceOutcome.objects.filter(
        device=hosts[0].device, source=DeviceOutcome.Source.SPOT_CHECK
    ).exists()


def test_an_inflated_count_is_a_failed_check_reversing_held_earnings(worlds, renter):
    """Past the tolerance: billed as the recount, flagged, the segment unpaid, and
    a failed check of the device (its held earnings reversed, as a failed spot
    check's)."""
    rig, hosts = worlds[0]
    earlier, _, _ = play(rig, hosts, renter, SCENARIOS["one attempt"])
    held = Earning.objects.get(attempt__job=earlier)
    assert held.status == Earning.Status.HELD
    job, ended, _ = play(rig, hosts, renter, SCENARIOS["an unbelievable count"])
    assert ended.tokens_billed == token_count(MODEL, TEXT)
    assert job.attempts.get().token_count_flagged
    assert not Earning.objects.filter(attempt__job=job).exists(), "unpaid"
    held.refresh_from_db()
    assert held.status == Earning.Status.REVERSED
    assert DeviceOutcome.objects.filter(
        device=hosts[0].device,
        source=DeviceOutcome.Source.SPOT_CHECK,
        success=False,
    ).exists()


def test_the_reaper_closes_a_job_with_the_text_its_ended_attempts_delivered(
    worlds, renter
):
    """A coordinator died during a continuation: the job is closed with the text
    its first segment recorded delivering, and billed for that text alone."""
    from jobs.services import attempts_reap

    rig, hosts = worlds[0]
    job = rig.job(renter=renter, model=MODEL)
    rig.segment(
        job,
        text="The capital of ",
        outcome=Attempt.Outcome.DIED_MIDSTREAM,
        device=hosts[0].device,
    )
    rig.attempt(job, continue_from="The capital of ", device=hosts[1].device)
    Job.objects.filter(id=job.id).update(lease_until=timezone.now() - timedelta(1))
    assert attempts_reap() == 1
    job.refresh_from_db()
    assert job.output_text == "The capital of "
    assert job.tokens_billed == token_count(MODEL, "The capital of ")
    assert job.error_code == "coordinator_lost"
