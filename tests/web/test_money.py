"""Money as people read it: to the cent, sub-cent amounts to three significant
digits without trailing zeros (the exact figure in the title), prices per million tokens, human dates, statement lines in words, payout
errors in words."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from billing.money import usd_to_nano
from billing.services import renter_top_up
from billing.templatetags.billing_money import per_million, usd, usd_text, when


@pytest.mark.parametrize(
    "nano,text",
    [
        (0, "$0.00"),
        (usd_to_nano("4.9999976"), "$5.00"),
        (994_086_791, "$0.99"),
        (usd_to_nano(1250), "$1,250.00"),
        (-usd_to_nano("1.5"), "-$1.50"),
        (10_000_000, "$0.01"),
        (9_999_999, "$0.01"),
        (800, "$0.0000008"),
        (1, "$0.000000001"),
        (3_400, "$0.0000034"),
        (2_261_234, "$0.00226"),
        (2_261_500, "$0.00226"),
        (2_265_000, "$0.00227"),
        (-5_808_009, "-$0.00581"),
        (5_000_000, "$0.005"),
        (120_000, "$0.00012"),
    ],
)
def test_amounts_read_to_the_cent_and_sub_cent_amounts_to_three_digits(nano, text):
    """From a cent up: two decimals, half up. Below: three significant digits,
    half up, no trailing zero (issue 35: not "$0.000003400 <1¢")."""
    assert usd_text(nano) == text


def test_the_html_form_keeps_the_exact_figure_when_rounded():
    assert usd(800) == '<span class="usd">$0.0000008</span>'
    rounded = usd(994_086_791)
    assert ">$0.99<" in rounded and 'title="$0.994086791 exactly"' in rounded
    sub_cent = usd(2_261_234)
    assert ">$0.00226<" in sub_cent and 'title="$0.002261234 exactly"' in sub_cent
    assert "title" not in usd(usd_to_nano(5)) and "title" not in usd(3_400)
    assert usd(None) == "" and usd("") == ""


def test_a_value_that_is_no_amount_is_refused():
    with pytest.raises(ValueError):
        usd_text("1.5")


def test_prices_read_per_million_tokens():
    assert per_million(200) == "$0.20 / 1M tokens"
    assert per_million(1_500) == "$1.50 / 1M tokens"


def test_dates_read_as_people_read_them():
    moment = datetime(2026, 3, 1, 9, 5, tzinfo=UTC)
    assert when(moment) == (
        '<time datetime="2026-03-01T09:05:00+00:00">1 Mar 2026, 09:05 UTC</time>'
    )


def test_the_statement_says_what_each_line_was(owner_client, owner, machine):
    from django.utils import timezone

    from billing.models import Account, LedgerTransaction
    from billing.services import account_for, ledger_post, rental_charge
    from jobs.models import Rental

    from .conftest import attempt_make

    renter_top_up(user=owner, amount_nano=usd_to_nano(5), key="statement-words")
    job = attempt_make(machine.devices.get(), renter=owner, tokens=12).job
    ledger_post(
        kind=LedgerTransaction.Kind.CHARGE,
        key=f"charge:{job.id}",
        job_id=job.id,
        legs=[
            (account_for(kind=Account.Kind.RENTER_CREDIT, user=owner), -2_400),
            (account_for(kind=Account.Kind.PLATFORM), 2_400),
        ],
        memo="12 tokens of smollm2-135m-instruct",
    )
    rental = Rental.objects.create(
        renter=owner,
        device=machine.devices.get(),
        hours=2,
        price_per_hour_nano=usd_to_nano("0.20"),
    )
    upto = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
    rental_charge(
        rental=rental,
        amount_nano=usd_to_nano("0.30"),
        since=upto - timedelta(hours=1.5),
        upto=upto,
        now=timezone.now(),
    )
    body = owner_client.get(reverse("billing:statement")).content.decode()
    assert "12 output tokens of smollm2-135m-instruct" in body
    assert (
        "Rental of rig-1 gpu0: 1.50 h at $0.20/h, up to 1 Mar 2026, 09:30 UTC" in body
    )
    # no raw ISO time in the words (only in <time datetime="…">)
    assert "T09:30:00" not in body.replace('datetime="2026-03-01T09:30:00', "")
    assert "Credit added" in body
    assert "-$0.30" in body and ">-$0.0000024<" in body
    assert "charged per token as well" in " ".join(body.split())


def test_a_payout_refusal_reads_in_words(owner_client, owner):
    answer = owner_client.post(reverse("billing:payout_create"), {"amount_usd": "5"})
    assert answer.status_code == 400
    body = " ".join(answer.content.decode().split())
    assert "at most 0 USD" not in body and "1E-9" not in body
    assert "You have no earnings available to pay out yet" in body
    answer = owner_client.post(reverse("billing:payout_create"), {"amount_usd": "0"})
    body = " ".join(answer.content.decode().split())
    assert "1E-9" not in body and "greater than or equal" not in body
    assert "Enter an amount greater than $0.00." in body


def test_a_chart_s_top_line_is_a_round_figure_over_its_tallest_bar():
    from hosts.charts import bar_chart, nice_top

    assert [nice_top(v) for v in (1, 3, 41, 2_500, 3_400, 9_999_999)] == [
        1,
        5,
        50,
        2_500,
        5_000,
        10_000_000,
    ]
    chart = bar_chart([("01 Dec", 3_400, "$0.0000034")], fmt=lambda v: usd_text(int(v)))
    # one tiny day: the axis says how tiny, the bar is not a full-height block
    (bar,) = chart.bars
    assert chart.ymax == 5_000 and bar[3] < 100 - 30
    assert [text for _, text in chart.axis.ticks] == ["$0.00", "", "$0.000005"]


def test_the_score_chart_places_samples_by_time_under_dated_days():
    from hosts.charts import line_chart

    end = datetime(2026, 12, 7, 15, 0, tzinfo=UTC)
    start = end - timedelta(days=7)
    samples = [(end - timedelta(days=6), 40), (end - timedelta(hours=1), 80)]
    chart = line_chart(samples, start=start, end=end, ymax=100)
    (x1, y1), (x2, y2) = (tuple(map(float, p.split(","))) for p in chart.points.split())
    left, inner = chart.axis.left, chart.width - chart.axis.left - 4
    # by time, not by index: six days of seven from the left, an hour from the right
    assert abs(x1 - (left + inner / 7)) < 1 and abs(x2 - (left + inner * (1 - 1 / 168))) < 1
    assert y2 < y1  # 80 above 40
    assert [text for _, text in chart.axis.ticks] == ["0", "50", "100"]
    days = chart.axis.days
    assert [text for _, text, _ in days][0] == "01 Dec"  # the first midnight in the window
    assert all(b[0] - a[0] >= 50 for a, b in zip(days, days[1:]))  # none overlap
    assert all(left <= x <= chart.width - 22 for x, _, _ in days)
    empty = line_chart([], start=start, end=end, ymax=100)
    assert empty.empty and empty.axis.days == days


def test_a_young_device_s_score_chart_spans_its_own_hours():
    """A device 35 minutes old: its chart begins an hour ago, not a week ago
    (its samples were a speck at the right edge), its marks are hours."""
    from hosts.charts import score_chart

    now = datetime(2026, 12, 7, 6, 50, tzinfo=UTC)
    samples = [(now - timedelta(minutes=m), s) for m, s in ((35, 100), (20, 70), (5, 41))]
    chart, start = score_chart(samples, now=now, window=timedelta(days=7))
    assert start == now - timedelta(hours=1)
    xs = [float(p.split(",")[0]) for p in chart.points.split()]
    assert xs[0] < chart.width / 2 < xs[-1]  # spread over the plot
    texts = [text for _, text, _ in chart.axis.days]
    assert texts and all(":" in text for text in texts), texts
    week = [(now - timedelta(days=6, hours=h), 60) for h in (0, 1)]
    _, since = score_chart(week, now=now, window=timedelta(days=7))
    assert since == week[0][0]
