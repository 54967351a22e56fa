"""The invariants of a chaos run, from its database and its renters' records.

``python -m tests.chaos.check RECORDS.json`` (with the run's ``DATABASE_URL``)
prints ``{"counts": {...}, "breaches": [...]}`` as JSON and exits 1 on a breach.
Every rule of issue 26, item 4:

* every request ended with the full answer, a clean 429/502/503/504 (503 and
  429 with ``Retry-After``), or an in-band error after a prefix of the right
  answer; a cut connection only for a request in flight when its coordinator
  was SIGKILLed; a renter that went away received a prefix;
* no text repeated or contradicted: a scripted answer is checked exactly
  against ``agent.engines.scripted.answer_for``, and each job's text is its
  attempts' texts end to end, each continuation starting where they stopped;
* each job charged once, exactly for what its renter received (its text),
  each host paid ``BALLAST_HOST_SHARE`` of its receipted segments and nothing
  for the others;
* the ledger balances and every running balance is the sum of its entries;
* nothing open once settled: no job open, no slot held, no attempt unfinished.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

CLEAN = (429, 502, 503, 504)
CLOSE_S = 5.0  # how long a coordinator may take to close a job its renter left


def record_ending(
    record: dict, expected: str | None, killed_at: list[float]
) -> tuple[str, str]:
    """(ending, breach or "") of one renter record; ``expected`` is the exact
    answer (None for the real model's)."""
    text = record["text"]
    prefix_ok = expected is None or expected.startswith(text)
    served_by_killed = record["coordinator"] in ("", "coordinator-b")

    def died_within(after_end_s: float) -> bool:
        return served_by_killed and any(
            record["started"] - 0.5 <= t <= record["ended"] + after_end_s
            for t in killed_at
        )

    if record["cut"] == "renter disconnected":
        # its coordinator died while closing the job (the host's receipt is
        # awaited up to BALLAST_CANCEL_RECEIPT_WAIT_S): what it relayed was
        # never stored
        if died_within(CLOSE_S):
            return (
                "cut_by_coordinator_death",
                "" if prefix_ok else "a disconnected renter got wrong text",
            )
        return (
            "client_disconnect",
            "" if prefix_ok else "a disconnected renter got wrong text",
        )
    if record["cut"]:
        if died_within(0.5):
            return (
                "cut_by_coordinator_death",
                "" if prefix_ok else "wrong text before the cut",
            )
        return "cut", f"a cut connection with no coordinator death: {record['cut']}"
    status = record["status"]
    if status == 200 and not record["error_code"]:
        if expected is not None and text != expected:
            return (
                "full",
                "the answer is not exactly the prompt's (repeated or contradicted)",
            )
        if record["finish_reason"] not in ("stop", "length") or not text:
            return (
                "full",
                f"finish_reason {record['finish_reason']!r} with {len(text)} chars",
            )
        return "full", ""
    if status == 200:
        return "inband_error", "" if prefix_ok else "an in-band error after wrong text"
    if status in CLEAN and not text:
        if (
            status in (429, 503)
            and not record["retry_after"]
            and record["kind"] != "ws"
        ):
            return f"clean_{status}", f"{status} without Retry-After"
        return f"clean_{status}", ""
    return f"status_{status}", f"answered {status} {record['error_code']!r}"


def job_breaches(
    job, attempts: list, charges: list, earnings: dict, receipts: dict
) -> list[str]:
    """What is wrong with one finished job's text, charge and host pay."""
    from django.conf import settings

    from billing.models import Account, ReceiptCheck
    from billing.money import share_of

    out = []
    if job.status in job.OPEN_STATUSES:
        out.append(f"job {job.id} still {job.status}")
    joined, offset = "", 0
    for attempt in attempts:
        if attempt.state != attempt.State.ENDED:
            out.append(
                f"attempt {attempt.id} of job {job.id} unfinished ({attempt.state})"
            )
        if attempt.continue_from_chars != offset:
            out.append(
                f"attempt {attempt.id} continued from {attempt.continue_from_chars}, "
                f"not {offset}"
            )
        joined += attempt.output_text
        offset += attempt.output_chars
    if joined != job.output_text:
        out.append(f"job {job.id}: its attempts' texts are not its text")
    price = job.price_completion_nano or 0
    if job.cost_nano != job.tokens_billed * price:
        out.append(f"job {job.id}: cost {job.cost_nano} != tokens × price")
    if job.tokens_billed != sum(a.tokens_billed for a in attempts):
        out.append(f"job {job.id}: tokens billed != the sum of its segments'")
    if len(charges) > 1 or (job.cost_nano > 0) != bool(charges):
        out.append(f"job {job.id}: {len(charges)} charges for cost {job.cost_nano}")
    for txn in charges:
        renter_legs = [
            e.amount_nano
            for e in txn.entries.all()
            if e.account.kind == Account.Kind.RENTER_CREDIT
        ]
        if renter_legs != [-job.cost_nano]:
            out.append(
                f"job {job.id}: the renter was charged {renter_legs}, cost {job.cost_nano}"
            )
    for attempt in attempts:
        earning = earnings.get(attempt.id)
        receipted = receipts.get(attempt.id) == ReceiptCheck.Verdict.VALID
        paid = receipted and not attempt.token_count_flagged
        due = (
            share_of(attempt.tokens_billed * price, settings.BALLAST_HOST_SHARE)
            if paid
            else 0
        )
        got = earning.amount_nano if earning else 0
        if got != due:
            out.append(
                f"attempt {attempt.id}: host paid {got}, due {due} (receipt "
                f"{receipts.get(attempt.id)})"
            )
    return out


def check(data: dict) -> dict:
    """Counts and breaches of a run (``data``: what ``tests.chaos.run`` wrote)."""
    from django.db.models import Sum

    from agent.engines.scripted import answer_for
    from billing.models import Account, Earning, Entry, LedgerTransaction, ReceiptCheck
    from billing.selectors import transactions_unbalanced
    from hosts.models import Device
    from jobs.models import Attempt, Job

    breaches: list[str] = []
    endings: Counter = Counter()
    jobs = {str(j.id): j for j in Job.objects.all()}
    for record in data["records"]:
        scripted = record["model"] == data["scripted_model"]
        expected = answer_for(record["prompt"], data["words"]) if scripted else None
        ending, breach = record_ending(record, expected, data["coordinator_killed_at"])
        endings[ending] += 1
        if breach:
            breaches.append(f"request {record['index']} ({record['kind']}): {breach}")
        job = jobs.get(record["job"])
        if job is not None and ending in ("full", "inband_error"):
            if job.output_text != record["text"]:
                breaches.append(
                    f"request {record['index']}: job {job.id}'s text is not what "
                    "its renter received"
                )
        elif ending == "cut_by_coordinator_death":
            pass  # what a dead process relayed was never stored: not billed
        elif job is not None and not job.output_text.startswith(record["text"]):
            breaches.append(
                f"request {record['index']}: the renter received text its job lacks"
            )
    attempts: dict = {}
    for attempt in Attempt.objects.order_by("offered_at", "id"):
        attempts.setdefault(attempt.job_id, []).append(attempt)
    charges: dict = {}
    for txn in LedgerTransaction.objects.filter(
        kind=LedgerTransaction.Kind.CHARGE
    ).prefetch_related("entries__account"):
        charges.setdefault(txn.job_id, []).append(txn)
    earnings = {e.attempt_id: e for e in Earning.objects.exclude(attempt=None)}
    receipts = dict(ReceiptCheck.objects.values_list("attempt_id", "verdict"))
    for job in jobs.values():
        breaches += job_breaches(
            job, attempts.get(job.id, []), charges.get(job.id, []), earnings, receipts
        )
    breaches += [
        f"ledger transaction {t} unbalanced" for t in transactions_unbalanced()
    ]
    for account in Account.objects.filter(kind=Account.Kind.RENTER_CREDIT):
        total = (
            Entry.objects.filter(account=account).aggregate(s=Sum("amount_nano"))["s"]
            or 0
        )
        if account.balance_nano != total:
            breaches.append(
                f"account {account.id}: running balance {account.balance_nano} "
                f"!= its entries' {total}"
            )
    held = Device.objects.filter(slots_used__gt=0).count()
    if held:
        breaches.append(f"{held} device(s) still hold slots")
    faults = data["faults"]
    breaches += [
        f"no {name} was injected"
        for name in data["faults_named"]
        if not faults.get(name)
    ]
    counts = {
        "requests": len(data["records"]),
        "endings": dict(endings),
        "jobs": len(jobs),
        "failovers": sum(j.failed_over for j in jobs.values()),
        "continuations": Attempt.objects.filter(kind=Attempt.Kind.CONTINUATION).count(),
        "attempt_outcomes": dict(Counter(a.outcome for a in Attempt.objects.all())),
        "charges": sum(len(c) for c in charges.values()),
        "earnings": len(earnings),
        "faults": faults,
    }
    return {"counts": counts, "breaches": breaches}


def main() -> int:
    import django

    django.setup()
    with open(sys.argv[1]) as handle:
        report = check(json.load(handle))
    print(json.dumps(report))
    return 1 if report["breaches"] else 0


if __name__ == "__main__":
    sys.exit(main())
