"""The people and history the browser tests look at, written into the database of
a running coordinator (``python -m tests.web.browser.world PHASE`` in its
environment; prints one JSON object).

Phases:

- ``people``: a host (``host@example.com``) with two machines (``rig-1``, whose
  token is printed for an agent, and one with a long name that has not connected
  yet, whose token is printed too), a
  renter (``renter@example.com``, 5 USD, an API key), a support ticket with staff's
  answer, staff (``staff@example.com``, a superuser) and a credit code worth
  2 USD. Passwords: ``tests.web.conftest.PASSWORD``.
  → ``{"token", "rig_id", "long_id", "long_token", "api_key", "ticket_id", "code",
  "renter_id"}``
- ``history MACHINE_ID``: once rig-1's agent has said hello: a week of scores,
  earnings on several days, a failed-over job, a failed model load, a benchmark,
  nine days of online history with outages (registered nine days ago), the
  renter's charges on several past days and a spending cap on their key.
  → ``{"job_ids": [...], "key_id"}`` (the renter's jobs, newest first)
"""

from __future__ import annotations

import json
import os
import sys


def people() -> dict:
    from django.contrib.auth import get_user_model

    from billing.money import usd_to_nano
    from billing.services import credit_code_create, renter_top_up
    from hosts.services import machine_register, user_get_or_create
    from jobs.services import api_key_create
    from support.services import ticket_open, ticket_reply

    from ..conftest import PASSWORD

    users = get_user_model()
    host = user_get_or_create(email="host@example.com")
    renter = user_get_or_create(email="renter@example.com")
    for user in (host, renter):
        user.set_password(PASSWORD)
        user.save()
    staff = users.objects.create_superuser(
        username="staff@example.com", email="staff@example.com", password=PASSWORD
    )
    rig, token = machine_register(owner=host, name="rig-1", region="eu")
    long, long_token = machine_register(
        owner=host,
        name="the-big-gaming-pc-in-the-living-room-under-the-stairs-2024",
        region="us-east",
    )
    renter_top_up(user=renter, amount_nano=usd_to_nano(5), key="browser-world")
    _, api_key = api_key_create(user=renter, name="my-app")
    ticket = ticket_open(
        author=host,
        subject="rig-1 shows offline but the agent runs",
        body="The agent prints 'connected' but the dashboard says offline.",
    )
    ticket_reply(
        ticket=ticket,
        author=staff,
        body="Your agent could not reach us through the proxy. Set HTTPS_PROXY "
        "and restart it.",
    )
    credit_code_create(
        amount_nano=usd_to_nano(2), code="WELCOME-2026", created_by=staff, memo="demo"
    )
    return {
        "token": token,
        "rig_id": str(rig.id),
        "long_id": str(long.id),
        "long_token": long_token,
        "api_key": api_key,
        "ticket_id": ticket.id,
        "code": "welcome-2026",
        "renter_id": renter.id,
    }


def history(machine_id: str) -> dict:
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from billing.models import Earning
    from hosts.models import Machine, ScoreSample
    from hosts.services import benchmark_record, capability_failed_record
    from jobs.models import ApiKey, Attempt, Job
    from jobs.services import api_key_cap_set

    from ..conftest import MODEL, attempt_make

    machine = Machine.objects.get(id=machine_id)
    device = machine.devices.get(index=0)
    renter = get_user_model().objects.get(email="renter@example.com")
    now = timezone.now()
    scores = [60, 61, 63, 62, 66, 70, 72, 71, 58, 49, 52, 57, 63, 68, 74, 77, 79, 80]
    ScoreSample.objects.bulk_create(
        ScoreSample(
            device=device,
            score=s,
            taken_at=now - timedelta(hours=8 * (len(scores) - i)),
        )
        for i, s in enumerate(scores)
    )
    for days, nano in [(1, 41_000), (2, 29_500), (3, 52_300), (5, 18_000)]:
        attempt = attempt_make(
            device, renter=renter, earn_nano=nano, tokens=nano // 160
        )
        Earning.objects.filter(attempt=attempt).update(
            created_at=now - timedelta(days=days), status=Earning.Status.RELEASED
        )
    first = attempt_make(
        device, renter=renter, outcome="died_midstream", failed_over=True
    )
    Attempt.objects.create(
        job=first.job,
        device=device,
        kind=Attempt.Kind.CONTINUATION,
        state=Attempt.State.ENDED,
        outcome="succeeded",
        claim_deadline=now,
        output_chars=90,
        tokens_billed=22,
    )
    capability_failed_record(
        machine_id=machine_id,
        report={
            "device": 0,
            "model": "llama-3.1-70b",
            "error": "CUDA error: out of memory (needed 40960 MiB)",
        },
    )
    benchmark_record(
        machine_id=machine_id,
        report={
            "device": 0,
            "model": MODEL,
            "tokens_per_s": 142.5,
            "ttft_ms": 95.0,
            "vram_used_mb": 310,
        },
    )
    online_history(machine, now)
    _spend_history(renter, now)
    key = ApiKey.objects.get(user=renter, name="my-app")
    api_key_cap_set(user=renter, key_id=key.id, cap_nano=10**9, period="day")
    jobs = Job.objects.filter(renter=renter).order_by("-created_at")
    return {
        "job_ids": [str(j) for j in jobs.values_list("id", flat=True)],
        "key_id": key.id,
    }


def _spend_history(renter, now) -> None:
    """Charges of ``renter`` on past days (the ledger stamps rows with the
    clock, so the clock is set back for each posting)."""
    from datetime import timedelta

    from django.utils import timezone

    from billing.models import Account
    from billing.services import account_for, ledger_post

    real_now = timezone.now
    try:
        spent = [(1, 12_000_000), (3, 41_000_000), (4, 3_000), (9, 25_000_000)]
        for days, nano in spent:
            when = now - timedelta(days=days)
            timezone.now = lambda when=when: when
            ledger_post(
                kind="charge",
                key=f"browser-world-spend:{days}",
                legs=[
                    (account_for(kind=Account.Kind.RENTER_CREDIT, user=renter), -nano),
                    (account_for(kind=Account.Kind.PLATFORM), nano),
                ],
                memo=f"{nano // 200} tokens of an earlier day",
            )
    finally:
        timezone.now = real_now


def online_history(machine, now) -> None:
    """Nine days of online spans before today: mostly online, a night off now
    and then, one day away, short drops (registered nine days ago)."""
    from datetime import UTC, datetime, time, timedelta

    from hosts.models import Machine, OnlineSpan

    today = datetime.combine(now.astimezone(UTC).date(), time(0), tzinfo=UTC)
    Machine.objects.filter(id=machine.id).update(
        created_at=today - timedelta(days=9, hours=-7)
    )
    hours = {  # days ago -> online (from, to) hours of that day
        9: [(7, 24)],
        8: [(0, 1.5), (7.2, 23)],
        7: [(8, 12.4), (12.6, 24)],
        6: [(0, 24)],
        5: [(0, 2), (17, 24)],
        4: [],
        3: [(9, 18.5), (19, 23.9)],
        2: [(6.5, 24)],
        1: [(0, 11), (11.25, 24)],
    }
    OnlineSpan.objects.bulk_create(
        OnlineSpan(
            machine=machine,
            started_at=today - timedelta(days=ago) + timedelta(hours=start),
            ended_at=today - timedelta(days=ago) + timedelta(hours=end),
        )
        for ago, spans in hours.items()
        for start, end in spans
    )


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ballast.settings")
    import django

    django.setup()
    phase = argv[0]
    out = people() if phase == "people" else history(argv[1])
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
