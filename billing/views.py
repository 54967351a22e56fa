"""Money pages: the renter's usage and statement, the host's earnings and payouts.

Thin: parse, call a selector or a service, render. Every page shows only the
signed-in user's own money.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from . import selectors, services
from .forms import PayoutRequestForm
from .models import PayoutRequest


@login_required
@require_http_methods(["GET"])
def statement(request: HttpRequest) -> HttpResponse:
    """The renter's balance, charged usage per model and ledger statement."""
    return render(
        request,
        "billing/statement.html",
        {
            "balance": selectors.renter_balance_nano(user=request.user),
            "usage": selectors.renter_usage_by_model(user=request.user),
            "entries": selectors.renter_statement(user=request.user),
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
    form = PayoutRequestForm(request.POST)
    if form.is_valid():
        try:
            services.payout_request(
                host=request.user,
                amount_nano=form.amount_nano(),
                note=form.cleaned_data["note"],
            )
        except services.PayoutError as exc:
            form.add_error("amount_usd", str(exc))
        else:
            messages.success(request, "Payout requested; staff will review it.")
            return redirect("billing:earnings")
    return _earnings_page(request, form, status=400)
