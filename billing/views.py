"""Money pages: the renter's usage and statement (and its CSV), the host's
earnings and payouts.

Thin: parse, call a selector or a service, render. Every page shows only the
signed-in user's own money.
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from datetime import datetime
from datetime import timezone as dt_timezone

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from ballast.db import db_call
from catalog.models import CatalogModel

from . import selectors, services
from .forms import PayoutRequestForm, payout_limit_words
from .models import Account, Earning, Entry, LedgerTransaction, PayoutRequest
from .money import nano_to_usd
from .templatetags.billing_money import usd_text


def statement_lines(entries: list[Entry]) -> list[dict]:
    """What each statement entry was, in words: dicts of ``entry``, ``what`` (text),
    ``hours`` (a rental's charged hours, Decimal-like float, or None).

    A charge says its tokens and model (and a failover's continuation); a rental
    says its device and hours at its hourly price, up to when; a top-up says
    credit added (with its memo: a code, staff's reason); a refund says why.
    Rentals are found through the hold their charge paid the host
    (``Earning.rental``): the ledger's key names the rental and the period's end
    (``rental:<id>:<ISO time>``).
    """
    rental_ids = {
        e.transaction.key.split(":")[1]
        for e in entries
        if e.transaction.kind == LedgerTransaction.Kind.RENTAL
    }
    rentals = {
        str(earning.rental_id): earning.rental
        for earning in Earning.objects.filter(rental_id__in=rental_ids).select_related(
            "rental__device__machine"
        )
    }
    lines = []
    for entry in entries:
        txn = entry.transaction
        what = txn.get_kind_display()
        if txn.kind == LedgerTransaction.Kind.CHARGE and txn.job is not None:
            tokens = txn.job.tokens_billed
            what = f"{tokens} output token{'s' if tokens != 1 else ''} of {txn.job.model_id}"
            if txn.job.failed_over:
                what += " (continued on another device after a failover)"
        elif txn.kind == LedgerTransaction.Kind.RENTAL:
            _, rental_id, period = txn.key.split(":", 2)
            upto = period.rsplit("/", 1)[-1]  # the key names the period since/upto
            rental = rentals.get(rental_id)
            until = datetime.fromisoformat(upto)
            until_text = f"{until.day} {until:%b %Y, %H:%M} UTC"
            if rental is not None and rental.price_per_hour_nano:
                hours = abs(entry.amount_nano) / rental.price_per_hour_nano
                what = (
                    f"Rental of {rental.device.machine.name} gpu{rental.device.index}: "
                    f"{hours:.2f} h at {usd_text(rental.price_per_hour_nano)}/h, "
                    f"up to {until_text}"
                )
            else:
                what = f"Rental time up to {until_text}"
        elif txn.kind == LedgerTransaction.Kind.TOP_UP:
            what = "Credit added"
            if txn.memo and txn.memo != "credit top-up":
                what += f": {txn.memo}"
        elif txn.kind == LedgerTransaction.Kind.REFUND:
            what = f"Refund: {txn.memo}" if txn.memo else "Refund"
        elif txn.memo:
            what = f"{what}: {txn.memo}"
        lines.append({"entry": entry, "what": what})
    return lines


@login_required
@require_http_methods(["GET"])
def statement(request: HttpRequest) -> HttpResponse:
    """The renter's balance, charged usage per model (with each model's price per
    million tokens) and ledger statement, each line in words."""
    usage = selectors.renter_usage_by_model(user=request.user)
    prices = dict(
        CatalogModel.objects.filter(id__in=[r["model"] for r in usage]).values_list(
            "id", "price_completion_nano"
        )
    )
    for row in usage:
        row["price_nano"] = prices.get(row["model"])
    return render(
        request,
        "billing/statement.html",
        {
            "balance": selectors.renter_balance_nano(user=request.user),
            "usage": usage,
            "lines": statement_lines(
                list(selectors.renter_statement(user=request.user))
            ),
        },
    )


def _earnings_page(
    request: HttpRequest, form: PayoutRequestForm, status: int = 200
) -> HttpResponse:
    return render(
        request,
        "billing/earnings.html",
        {
            "balances": selectors.host_balances_nano(user=request.user),
            "earnings": selectors.host_earnings(user=request.user),
            "payouts": PayoutRequest.objects.filter(host=request.user)[:50],
            "form": form,
            "share_percent": format(
                (settings.BALLAST_HOST_SHARE * 100).normalize(), "f"
            ),
        },
        status=status,
    )


@login_required
@require_http_methods(["GET"])
def earnings(request: HttpRequest) -> HttpResponse:
    """The host's earnings (held, available, reversed, paid out) and the jobs behind them."""
    return _earnings_page(request, PayoutRequestForm())


@login_required
@require_http_methods(["POST"])
def payout_create(request: HttpRequest) -> HttpResponse:
    """Request a payout of up to the available balance; staff decide in the admin."""
    balances = selectors.host_balances_nano(user=request.user)
    form = PayoutRequestForm(request.POST, requestable_nano=balances["requestable"])
    if form.is_valid():
        try:
            services.payout_request(
                host=request.user,
                amount_nano=form.amount_nano(),
                note=form.cleaned_data["note"],
            )
        except services.PayoutError as exc:
            # another request took the balance meanwhile: the same words
            again = selectors.host_balances_nano(user=request.user)["requestable"]
            form.add_error(
                "amount_usd",
                payout_limit_words(again) if "requested now" in str(exc) else str(exc),
            )
        else:
            messages.success(request, "Payout requested; staff will review it.")
            return redirect("billing:earnings")
    return _earnings_page(request, form, status=400)


# the CSV's columns (docs/money.md "Pages")
STATEMENT_CSV_HEADER = [
    "time_utc",
    "type",
    "description",
    "job",
    "api_key",
    "model",
    "output_tokens",
    "amount_usd",
    "balance_usd",
]
CSV_BATCH = 500  # entries read and described at a time


def _csv_text(value: str) -> str:
    """A text cell that a spreadsheet will not run as a formula (OWASP's rule:
    a leading ``= + - @`` or control character gets a ``'``)."""
    return f"'{value}" if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def statement_chunk(
    *, user, after: tuple | None, balance: int, size: int | None = None
) -> tuple[list[list[str]], tuple | None, int]:
    """The next ``size`` (``CSV_BATCH``) entries of the renter's statement
    (oldest first, after the (time, entry id) ``after``) as CSV rows (``STATEMENT_CSV_HEADER``):
    time (ISO 8601 UTC), type, what it was in words, job id, the key that made
    the job (name and prefix), model, output tokens, the amount and the balance
    after it (``balance``: before these) in exact USD, nine decimals. Returns
    (rows, where the next chunk starts or None at the end, the balance after)."""
    entries = (
        Entry.objects.filter(
            account__kind=Account.Kind.RENTER_CREDIT, account__user=user
        )
        .select_related("transaction", "transaction__job__api_key")
        .order_by("transaction__created_at", "id")
    )
    if after is not None:
        at, entry_id = after
        entries = entries.filter(
            Q(transaction__created_at__gt=at)
            | Q(transaction__created_at=at, id__gt=entry_id)
        )
    size = size or CSV_BATCH
    batch = list(entries[:size])
    rows = []
    for line in statement_lines(batch):
        entry = line["entry"]
        txn, job = entry.transaction, entry.transaction.job
        balance += entry.amount_nano
        key = job.api_key if job is not None else None
        rows.append(
            [
                txn.created_at.astimezone(dt_timezone.utc).isoformat(),
                txn.kind,
                _csv_text(line["what"]),
                str(job.id) if job else "",
                _csv_text(f"{key.name} ({key.prefix}…)") if key else "",
                job.model_id if job else "",
                str(job.tokens_billed) if job else "",
                f"{nano_to_usd(entry.amount_nano):.9f}",
                f"{nano_to_usd(balance):.9f}",
            ]
        )
    last = batch[-1] if len(batch) == size else None
    return rows, (last.transaction.created_at, last.id) if last else None, balance


async def statement_csv_lines(*, user) -> AsyncIterator[str]:
    """The statement as CSV text, a chunk of ``CSV_BATCH`` rows at a time, each
    read in a worker thread (``ballast.db.db_call``): the ASGI server streams
    it without holding the whole statement in memory."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(STATEMENT_CSV_HEADER)
    after, balance = None, 0
    chunk = db_call(statement_chunk)
    while True:
        rows, after, balance = await chunk(user=user, after=after, balance=balance)
        writer.writerows(rows)
        yield out.getvalue()
        out.seek(0)
        out.truncate()
        if after is None:
            return


@login_required
@require_http_methods(["GET"])
def statement_csv(request: HttpRequest) -> StreamingHttpResponse:
    """The renter's whole statement as CSV, streamed (``statement_csv_lines``)."""
    response = StreamingHttpResponse(
        statement_csv_lines(user=request.user),
        content_type="text/csv; charset=utf-8",
    )
    day = timezone.now().date().isoformat()
    response["Content-Disposition"] = (
        f'attachment; filename="ballast-statement-{day}.csv"'
    )
    return response
