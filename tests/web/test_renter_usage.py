"""The renter's view of usage: the job log (which key, time to first token,
tokens per second; filters; pages), the statement as CSV (streamed) and the
chart of spend per day (an SVG drawn from the ledger)."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.urls import reverse
from django.utils import timezone

from billing.models import Account
from billing.services import account_for, ledger_post
from jobs.models import Attempt, Job
from jobs.services import api_key_create

from .conftest import MODEL


@pytest.fixture
def renter_client(client, renter):
    client.force_login(renter)
    return client


def _job(renter, device, *, key=None, status="succeeded", tokens=41, at=None):
    """A finished job: admitted at ``at``, first token 250 ms later, then
    ``tokens`` in 2 s (so 20.0 tokens/s after the first)."""
    at = at or timezone.now()
    job = Job.objects.create(
        renter=renter,
        api_key=key,
        model_id=MODEL,
        endpoint=Job.Endpoint.CHAT,
        status=status,
        tokens_billed=tokens,
        cost_nano=tokens * 200,
        finished_at=at + timedelta(seconds=2.25),
    )
    Job.objects.filter(id=job.id).update(created_at=at)
    Attempt.objects.create(
        job=job,
        device=device,
        state=Attempt.State.ENDED,
        outcome="succeeded",
        offered_at=at + timedelta(milliseconds=10),
        claim_deadline=at,
        first_token_at=at + timedelta(milliseconds=250),
        ended_at=at + timedelta(seconds=2.25),
        tokens_billed=tokens,
    )
    return job


def _charge(renter, nano: int, when, monkeypatch) -> None:
    """A charge of ``nano`` posted at ``when`` (the ledger stamps its rows with
    the clock: the clock is set back for the posting)."""
    monkeypatch.setattr(timezone, "now", lambda: when)
    ledger_post(
        kind="charge",
        key=f"charge-at:{when.isoformat()}:{nano}",
        legs=[
            (account_for(kind=Account.Kind.RENTER_CREDIT, user=renter), -nano),
            (account_for(kind=Account.Kind.PLATFORM), nano),
        ],
    )
    monkeypatch.undo()


def test_the_job_log_shows_the_key_first_token_and_rate(renter_client, renter, machine):
    key, _ = api_key_create(user=renter, name="nightly-batch")
    job = _job(renter, machine.devices.get(), key=key)
    html = renter_client.get(reverse("renter:jobs")).content.decode()
    row = re.search(r"<tr><td><time.*?</tr>", html, re.S).group(0)
    assert "nightly-batch" in row and key.prefix in row
    assert "250 ms" in row and ">20.0 tok/s<" in row  # with its unit
    assert str(job.id)[:8] in row
    detail = renter_client.get(reverse("renter:job", args=[job.id])).content.decode()
    assert "nightly-batch" in detail and "250 ms · 20.0" in detail


def test_the_job_log_filters_by_status_key_model_and_dates(
    renter_client, renter, stranger, machine
):
    device = machine.devices.get()
    mine, _ = api_key_create(user=renter, name="k-one")
    other, _ = api_key_create(user=renter, name="k-two")
    now = timezone.now()
    a = _job(renter, device, key=mine, at=now - timedelta(days=3))
    b = _job(renter, device, key=other, status="failed", at=now)
    url = reverse("renter:jobs")

    def ids(**query) -> set[str]:
        html = renter_client.get(url, query).content.decode()
        return set(re.findall(r'href="/renter/jobs/([0-9a-f-]{36})/"', html))

    assert ids() == {str(a.id), str(b.id)}
    assert ids(status="failed") == {str(b.id)}
    assert ids(key=mine.id) == {str(a.id)}
    assert ids(model=MODEL) == {str(a.id), str(b.id)}
    day = (now - timedelta(days=3)).date().isoformat()
    assert ids(since=day, until=day) == {str(a.id)}
    assert ids(since=now.date().isoformat()) == {str(b.id)}
    # a bad filter is said, not a 500; another renter's key is no choice
    page = renter_client.get(url, {"since": "yesterday", "status": "nope"})
    assert page.status_code == 200 and "Enter a valid date." in page.content.decode()
    theirs, _ = api_key_create(user=stranger, name="theirs")
    _job(stranger, device, key=theirs)
    assert ids(key=theirs.id) == {str(a.id), str(b.id)}  # the filter is refused


def test_the_job_log_pages_and_keeps_the_filters(renter_client, renter, machine):
    device = machine.devices.get()
    now = timezone.now()
    for i in range(53):
        _job(renter, device, at=now - timedelta(minutes=i))
    url = reverse("renter:jobs")
    first = renter_client.get(url, {"status": "succeeded"}).content.decode()
    assert "page 1 of 2" in first and "53 jobs" in first
    assert len(re.findall(r'href="/renter/jobs/[0-9a-f-]{36}/"', first)) == 50
    assert 'href="?status=succeeded&amp;page=2" rel="next"' in first
    second = renter_client.get(url, {"status": "succeeded", "page": 2}).content.decode()
    assert len(re.findall(r'href="/renter/jobs/[0-9a-f-]{36}/"', second)) == 3
    assert "page 2 of 2" in second
    assert renter_client.get(url, {"page": "x"}).status_code == 200


@pytest.mark.django_db(transaction=True)  # read from a worker thread's connection
def test_the_statement_streams_as_csv(renter_client, renter, machine):
    key, _ = api_key_create(user=renter, name="=HYPERLINK(evil)")
    job = _job(renter, machine.devices.get(), key=key, tokens=7)
    ledger_post(
        kind="charge",
        key=f"charge:{job.id}",
        job_id=job.id,
        legs=[
            (account_for(kind=Account.Kind.RENTER_CREDIT, user=renter), -1400),
            (account_for(kind=Account.Kind.PLATFORM), 1400),
        ],
    )
    rows = _csv_rows(renter_client)
    assert rows[0][:3] == ["time_utc", "type", "description"]
    assert rows[1][1] == "top_up" and rows[1][2] == "Credit added"
    assert rows[1][7] == "5.000000000" and rows[1][8] == "5.000000000"
    charge = rows[2]
    assert charge[1] == "charge" and charge[2] == f"7 output tokens of {MODEL}"
    assert charge[3] == str(job.id) and charge[5] == MODEL and charge[6] == "7"
    assert charge[4].startswith("'=HYPERLINK")  # never run as a formula
    assert charge[7] == "-0.000001400" and charge[8] == "4.999998600"
    assert "+00:00" in charge[0]


def _csv_rows(client) -> list[list[str]]:
    response = client.get(reverse("billing:statement_csv"))
    assert response.status_code == 200 and response.streaming
    assert response.is_async  # the ASGI server streams it as it is read
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert "attachment" in response["Content-Disposition"]

    async def read() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return list(csv.reader(io.StringIO(async_to_sync(read)().decode())))


@pytest.mark.django_db(transaction=True)  # read from a worker thread's connection
def test_the_csv_reads_the_statement_in_chunks(renter_client, renter, monkeypatch):
    """Entries past one chunk (here 2) all come, oldest first, with the
    running balance; entries at the same instant are not lost between chunks."""
    monkeypatch.setattr("billing.views.CSV_BATCH", 2)
    for i in range(4):
        legs = [
            (account_for(kind=Account.Kind.RENTER_CREDIT, user=renter), -(i + 1)),
            (account_for(kind=Account.Kind.PLATFORM), i + 1),
        ]
        ledger_post(kind="charge", key=f"chunk:{i}", legs=legs, memo=f"n{i}")
    rows = _csv_rows(renter_client)[1:]
    charges = [f"Charge: n{i}" for i in range(4)]
    assert [r[2] for r in rows] == ["Credit added", *charges]
    assert rows[-1][8] == "4.999999990"  # 5 USD − (1 + 2 + 3 + 4) nano-USD


def test_the_overview_draws_spend_per_day(renter_client, renter, monkeypatch):
    now = timezone.now()
    _charge(renter, 30_000_000, now - timedelta(days=2), monkeypatch)  # $0.03
    _charge(renter, 10_000_000, now - timedelta(days=2), monkeypatch)  # same day
    _charge(renter, 5_000_000, now, monkeypatch)  # today: $0.005
    _charge(renter, 9_000_000, now - timedelta(days=40), monkeypatch)  # too old
    html = renter_client.get(reverse("renter:overview")).content.decode()
    svg = re.search(r'<svg class="chart bars" id="spend-chart".*?</svg>', html, re.S)
    bars = re.findall(
        r'<rect class="bar" x="[\d.]+" y="[\d.]+" width="[\d.]+" height="([\d.]+)">'
        r"<title>([^<]+)</title>",
        svg.group(0),
    )
    assert len(bars) == 30
    tall = {title: float(h) for h, title in bars if float(h) > 0}
    day = (now - timedelta(days=2)).strftime("%d %b")
    # the top line is the next round figure over the tallest day ($0.05), on
    # an axis labelled in dollars: the tallest bar is 4/5 of the plot's 120 px
    assert tall[f"{day}: $0.04"] == 96
    today = tall[f"{now:%d %b}: $0.005"]
    assert today == pytest.approx(12, abs=0.1)
    assert len(tall) == 2
    assert 'the top line <strong id="spend-max">$0.05</strong>' in html
    ticks = re.findall(r'<text class="tick"[^>]*>([^<]*)</text>', svg.group(0))
    assert ticks == ["$0.00", "", "$0.05"]
    days = re.findall(r'<text class="day" [^>]*text-anchor="(\w+)">', svg.group(0))
    assert days[0] == "start" and days[-1] == "end" and len(days) >= 4
    total = '<span class="usd" title="$0.045 exactly">$0.05</span>'
    assert f'id="spend-total">{total}' in html


def test_an_empty_chart_says_so(renter_client):
    html = renter_client.get(reverse("renter:overview")).content.decode()
    assert "nothing spent in these days" in html
