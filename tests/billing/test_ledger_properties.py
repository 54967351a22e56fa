"""Property test: random job histories keep the ledger's promises (DESIGN.md "Money").

Histories mix successes, failovers before output, deaths mid-stream with and
without the one continuation, renter cancels, spot checks passed and failed
(a failure reverses the device's held earnings), holds released as time passes,
lying token counts, missing / bad / mismatched / replayed receipts, and duplicate
and late ``done`` frames. After each history:

- every ledger transaction balances (and the database's own checks pass);
- no job is charged twice; a spot check bills nobody, its host paid like a
  job's from the platform's ``platform_checks`` account;
- each job's charge = delivered tokens × price, as an independent model computes;
- each host share = 80 % of its receipted segment, rounded down, and the
  earnings' held / released / reversed states match the model;
- renter, host and platform balances equal the model's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from decimal import ROUND_DOWN, Decimal

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from billing.models import Account, Earning, LedgerTransaction
from billing.selectors import transactions_unbalanced
from billing.services import earnings_reverse_held, holds_release, renter_top_up
from hosts.services import user_get_or_create
from jobs.models import Attempt, Job
from jobs.services import attempt_end, job_finish
from tests.billing.helpers import UNTOKENIZED, Rig, balance, untokenized_model

pytestmark = pytest.mark.django_db

PRICE = UNTOKENIZED["price_completion_nano"]
SHARE = Decimal("0.80")
TEXT = st.text(alphabet="ab cd.é", min_size=1, max_size=24)
RECEIPT = st.sampled_from(
    ["valid", "valid", "valid", "missing", "bad", "other_text", "replay"]
)


@st.composite
def done_segment(draw):
    text = draw(TEXT)
    honest = draw(st.booleans()) or draw(st.booleans())
    tokens = (
        draw(st.integers(1, len(text)))
        if honest
        else len(text) + draw(st.integers(1, 5))
    )
    return {"text": text, "tokens": tokens, "receipt": draw(RECEIPT)}


@st.composite
def renter_job(draw):
    failures = draw(st.integers(0, 3))  # 3 means every attempt failed before output
    if failures == 3:
        return {"kind": "job", "failures": 3}
    ending = draw(
        st.sampled_from(["done", "done", "died", "died_then_continued", "cancelled"])
    )
    job = {
        "kind": "job",
        "failures": failures,
        "ending": ending,
        "first": draw(done_segment()),
    }
    if ending == "died_then_continued":
        job["second"] = draw(done_segment())
        job["second_dies"] = draw(st.booleans())
    job["duplicate"] = draw(st.booleans())
    return job


STEP = st.one_of(
    renter_job(),
    renter_job(),
    renter_job(),
    st.fixed_dictionaries(
        {"kind": st.just("spot"), "passed": st.booleans(), "text": TEXT}
    ),
    st.fixed_dictionaries({"kind": st.just("wait"), "hours": st.integers(1, 30)}),
)


@dataclass
class Expected:
    """The model's view of one paid segment."""

    amount: int
    device_id: int
    host_id: int
    release_at: object
    status: str = Earning.Status.HELD


def _billed(text: str, reported: int | None) -> tuple[int, bool]:
    """The rule for a model without a tokenizer: a believable report, else the characters."""
    if reported is not None and reported <= len(text):
        return reported, False
    return len(text), reported is not None


def _share(tokens: int) -> int:
    return int((Decimal(tokens * PRICE) * SHARE).to_integral_value(rounding=ROUND_DOWN))


class History:
    """Plays a history through the services and keeps the model's expectations."""

    def __init__(self, rig: Rig, renter) -> None:
        self.rig = rig
        self.renter = renter
        self.charges: dict[str, int] = {}  # job id → expected charge
        self.earnings: dict[str, Expected] = {}  # attempt id → expected earning
        self.signatures: list[str] = []
        self.reversed_total = 0
        self.checks_paid: dict[str, int] = {}  # spot-check job id → host's share

    def _segment(
        self, job: Job, seg: dict, *, outcome: str, continue_from: str = ""
    ) -> int:
        receipt = seg["receipt"]
        if receipt == "replay":
            receipt = self.signatures[-1] if self.signatures else "valid"
        with_done = outcome == Attempt.Outcome.SUCCEEDED
        attempt = self.rig.segment(
            job,
            text=seg["text"],
            outcome=outcome,
            tokens=seg["tokens"] if with_done else None,
            receipt=receipt,
            continue_from=continue_from,
        )
        if attempt.receipt:
            self.signatures.append(attempt.receipt)
        tokens, flagged = _billed(seg["text"], seg["tokens"] if with_done else None)
        assert (attempt.tokens_billed, attempt.token_count_flagged) == (tokens, flagged)
        if flagged and with_done and not job.is_spot_check:
            self._reverse_held(attempt.device_id)  # a failed check of its honesty
        paid = with_done and receipt == "valid" and not flagged and _share(tokens) > 0
        if paid and not job.is_spot_check:
            self.earnings[str(attempt.id)] = Expected(
                amount=_share(tokens),
                device_id=attempt.device_id,
                host_id=attempt.device.machine.owner_id,
                release_at=self.rig.now + timedelta(hours=24),
            )
        return tokens

    def job(self, step: dict) -> None:
        job = self.rig.job(renter=self.renter, model=UNTOKENIZED["id"])
        for outcome in [
            Attempt.Outcome.CLAIM_TIMEOUT,
            Attempt.Outcome.HOST_ERROR,
            Attempt.Outcome.FIRST_TOKEN_TIMEOUT,
        ][: step["failures"]]:
            self.rig.segment(job, text="", outcome=outcome)
        tokens = 0
        status = Job.Status.FAILED
        if step["failures"] < 3:
            ending = step["ending"]
            first_outcome = {
                "done": Attempt.Outcome.SUCCEEDED,
                "died": Attempt.Outcome.DIED_MIDSTREAM,
                "died_then_continued": Attempt.Outcome.STALLED,
                "cancelled": Attempt.Outcome.CANCELLED,
            }[ending]
            tokens += self._segment(job, step["first"], outcome=first_outcome)
            status = {
                "done": Job.Status.SUCCEEDED,
                "cancelled": Job.Status.CANCELLED,
            }.get(ending, Job.Status.FAILED)
            if ending == "died_then_continued":
                second_outcome = (
                    Attempt.Outcome.DIED_MIDSTREAM
                    if step["second_dies"]
                    else Attempt.Outcome.SUCCEEDED
                )
                tokens += self._segment(
                    job,
                    step["second"],
                    outcome=second_outcome,
                    continue_from=step["first"]["text"],
                )
                status = (
                    Job.Status.FAILED if step["second_dies"] else Job.Status.SUCCEEDED
                )
        finished = self.rig.finish(job, status=status)
        self.charges[str(job.id)] = tokens * PRICE
        assert finished.cost_nano == tokens * PRICE
        if step.get("duplicate"):
            self._duplicate(finished)

    def _duplicate(self, job: Job) -> None:
        """A second ``done`` for every attempt and a second finish: nothing changes."""
        for attempt in job.attempts.all():
            late = attempt_end(
                attempt_id=str(attempt.id),
                outcome=Attempt.Outcome.SUCCEEDED,
                output_text=attempt.output_text + "late",
                done={
                    "finish_reason": "stop",
                    "prompt_tokens": 1,
                    "completion_tokens": 1,
                    "receipt": attempt.receipt,
                },
                now=self.rig.now,
            )
            assert late is None
        again = job_finish(
            job_id=str(job.id),
            status=Job.Status.SUCCEEDED,
            output_text="x",
            now=self.rig.now,
        )
        assert again.cost_nano == job.cost_nano

    def spot(self, step: dict) -> None:
        job = self.rig.job(renter=self.renter, model=UNTOKENIZED["id"], spot_check=True)
        seg = {"text": step["text"], "tokens": 1, "receipt": "valid"}
        attempt = Attempt.objects.get(id=self._spot_attempt(job, seg))
        self.rig.finish(job)
        self.charges[str(job.id)] = 0
        if _share(1) > 0:  # paid like a job of one token, by the platform
            self.checks_paid[str(job.id)] = _share(1)
            self.earnings[str(attempt.id)] = Expected(
                amount=_share(1),
                device_id=attempt.device_id,
                host_id=attempt.device.machine.owner_id,
                release_at=self.rig.now + timedelta(hours=24),
            )
        if not step["passed"]:
            earnings_reverse_held(
                machine_id=attempt.device.machine_id,  # one device per machine
                reason="failed spot check",
                now=self.rig.now,
            )
            self._reverse_held(attempt.device_id)

    def _reverse_held(self, device_id: int) -> None:
        """The model of a failed check: the device's held earnings reversed."""
        for expected in self.earnings.values():
            if expected.device_id == device_id and expected.status == Earning.Status.HELD:
                expected.status = Earning.Status.REVERSED
                self.reversed_total += expected.amount

    def _spot_attempt(self, job: Job, seg: dict) -> str:
        attempt = self.rig.segment(
            job, text=seg["text"], tokens=seg["tokens"], receipt="valid"
        )
        self.signatures.append(attempt.receipt)
        return attempt.id

    def wait(self, step: dict) -> None:
        self.rig.advance(hours=step["hours"])
        holds_release(now=self.rig.now)
        for expected in self.earnings.values():
            if (
                expected.status == Earning.Status.HELD
                and expected.release_at <= self.rig.now
            ):
                expected.status = Earning.Status.RELEASED

    def check(self, topped_up: int) -> None:
        if connection.vendor == "postgresql":  # run the deferred balance triggers now
            with connection.cursor() as cursor:
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
                cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        assert transactions_unbalanced() == []
        charges = LedgerTransaction.objects.filter(kind=LedgerTransaction.Kind.CHARGE)
        per_job = Counter(
            str(job_id) for job_id in charges.values_list("job_id", flat=True)
        )
        assert all(n == 1 for n in per_job.values()), "a job was charged twice"
        assert set(per_job) == {
            job_id for job_id, cost in self.charges.items() if cost > 0
        } | set(self.checks_paid)
        for txn in charges.prefetch_related("entries__account"):
            legs = Counter()
            for e in txn.entries.all():
                legs[e.account.kind] += e.amount_nano
            if str(txn.job_id) in self.checks_paid:
                assert legs[Account.Kind.RENTER_CREDIT] == 0
                assert legs[Account.Kind.PLATFORM_CHECKS] == -self.checks_paid[
                    str(txn.job_id)
                ]
            else:
                assert legs[Account.Kind.RENTER_CREDIT] == -self.charges[
                    str(txn.job_id)
                ]
        for job in Job.objects.filter(id__in=self.charges):
            assert job.cost_nano == self.charges[str(job.id)]
        actual = {
            str(e.attempt_id): (e.amount_nano, e.status) for e in Earning.objects.all()
        }
        assert actual == {k: (v.amount, v.status) for k, v in self.earnings.items()}
        charged = sum(self.charges.values())
        checks = sum(self.checks_paid.values())
        shares = sum(v.amount for v in self.earnings.values()) - checks
        assert balance(Account.Kind.RENTER_CREDIT, self.renter) == topped_up - charged
        assert (  # the running total the credit check reads (billing migration 0004)
            Account.objects.get(
                kind=Account.Kind.RENTER_CREDIT, user=self.renter
            ).balance_nano
            == topped_up - charged
        )
        assert balance(Account.Kind.PLATFORM) == charged - shares + self.reversed_total
        assert balance(Account.Kind.PLATFORM_CHECKS) == -checks
        by_status = Counter()
        for v in self.earnings.values():
            by_status[v.status] += v.amount
        assert balance(Account.Kind.HOST_HELD) == by_status[Earning.Status.HELD]
        assert (
            balance(Account.Kind.HOST_AVAILABLE) == by_status[Earning.Status.RELEASED]
        )
        assert by_status[Earning.Status.REVERSED] == self.reversed_total


@hsettings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(STEP, min_size=1, max_size=8))
def test_it_keeps_the_ledger_promises_over_random_histories(steps, catalog, settings):
    settings.BALLAST_SPOT_CHECKS = False
    settings.BALLAST_HOST_SHARE = SHARE
    settings.BALLAST_HOLD_HOURS = 24
    with transaction.atomic():
        untokenized_model()
        renter = user_get_or_create(email="prop-renter@example.com")
        topped_up = 10**9
        renter_top_up(user=renter, amount_nano=topped_up, key="prop-top-up")
        rig = Rig(models=[UNTOKENIZED["id"]])
        for name in ("p1", "p2", "p3", "p4"):
            rig.host_add(name)
        history = History(rig, renter)
        for step in steps:
            getattr(history, step["kind"])(step)
        history.check(topped_up)
        transaction.set_rollback(True)
