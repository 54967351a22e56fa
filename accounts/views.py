"""Sign-up, where a log-in lands, the public models page and the renter's
pages: balance, spend, credit codes, keys and their caps, the job log.

Log in/out and password reset are django.contrib.auth's views (``accounts/urls.py``).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from ballast.ratelimits import post_limited
from billing.models import Account
from billing.money import nano_to_usd, usd_to_nano
from billing.selectors import renter_spend_daily
from billing.services import (
    CreditCodeError,
    balance_low_threshold_nano,
    balance_low_threshold_set,
    credit_code_redeem,
    credit_code_words,
    renter_balance_nano,
)
from billing.templatetags.billing_money import usd_text
from catalog.models import CatalogModel
from hosts.charts import bar_chart
from hosts.models import Machine
from jobs import rentals
from jobs.errors import ApiError
from jobs.modelfacts import WINDOW, models_facts
from jobs.models import Rental
from jobs.rentals import rental_price_per_hour_nano
from jobs.selectors import devices_rentable
from jobs.services import api_key_cap_set, api_key_create

from . import selectors, services
from .forms import (
    ApiKeyCreateForm,
    CreditCodeRedeemForm,
    JobLogFilterForm,
    KeyCapForm,
    LowBalanceForm,
    SignUpForm,
)

NEW_KEY_SESSION_KEY = "ballast_new_api_key"
JOB_LOG_PAGE = 50  # jobs per page of the job log
SPEND_DAYS = 30  # days of the spend chart


@post_limited("BALLAST_SIGNUP_RATE", "signup", field="email")
def signup(request: HttpRequest) -> HttpResponse:
    """Create an account (email + password) and log in (rate limited per
    address and email: ``BALLAST_SIGNUP_RATE``)."""
    if request.user.is_authenticated:
        return redirect("landing")
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(
            request,
            "Welcome to Ballast. Create an API key to rent, or register a machine"
            " to host.",
        )
        return redirect("renter:overview")
    return render(request, "registration/signup.html", {"form": form})


@login_required
@require_GET
def landing(request: HttpRequest) -> HttpResponse:
    """Where a log-in without ``next`` lands: a host (a machine not retired) on
    their machines, anyone else on their renter's pages."""
    hosts = Machine.objects.filter(owner_id=request.user.pk, retired_at__isnull=True)
    return redirect("hosts:dashboard" if hosts.exists() else "renter:overview")


@require_GET
def models_page(request: HttpRequest) -> HttpResponse:
    """The public models page: each model's price per million tokens in and
    out, context length, devices online and the fleet's measured speed
    (``jobs.modelfacts``, the facts ``GET /v1/models`` gives)."""
    return render(
        request,
        "accounts/models.html",
        {
            "facts": models_facts(now=timezone.now()),
            "window_h": int(WINDOW.total_seconds() // 3600),
            "api_base": request.build_absolute_uri("/v1/"),
        },
    )


@login_required
@require_GET
def overview(request: HttpRequest) -> HttpResponse:
    """The renter's balance, spend per day (a chart), credit codes, the
    low-balance email, API keys with their spending caps (a new key shown
    once) and rentals."""
    return _overview_page(request)


def _overview_page(request: HttpRequest, status: int = 200, **forms) -> HttpResponse:
    now = timezone.now()
    user = request.user
    daily = renter_spend_daily(user=user, now=now, days=SPEND_DAYS)
    chart = bar_chart(
        [(day.strftime("%d %b"), total, usd_text(total)) for day, total in daily],
        width=600,
        height=140,
        fmt=lambda nano: usd_text(int(nano)),
    )
    account = Account.objects.filter(
        kind=Account.Kind.RENTER_CREDIT, user_id=user.pk
    ).first()
    threshold = (
        balance_low_threshold_nano(account)
        if account is not None
        else usd_to_nano(settings.BALLAST_LOW_BALANCE_USD)
    )
    keys = selectors.api_keys_of(user=user)
    context = {
        "balance_nano": renter_balance_nano(user=user),
        "keys": [(key, key.spent_in_period_nano(now)) for key in keys],
        "rentals": selectors.rentals_of(user=user),
        "rentable": _rentable_devices(user),
        "rental_price_nano": rental_price_per_hour_nano(),
        "form": ApiKeyCreateForm(),
        "new_key": request.session.pop(NEW_KEY_SESSION_KEY, None),
        "api_base": request.build_absolute_uri("/v1/"),
        "spend_chart": chart,
        "spend_days": SPEND_DAYS,
        "spend_total": sum(total for _, total in daily),
        "spend_max": usd_text(int(chart.ymax)),
        "code_form": forms.get("code_form") or CreditCodeRedeemForm(),
        "cap_form": forms.get("cap_form") or KeyCapForm(user=user),
        "low_form": forms.get("low_form")
        or LowBalanceForm(
            initial={
                "threshold_usd": nano_to_usd(account.low_balance_nano)
                if account is not None and account.low_balance_nano is not None
                else None
            }
        ),
        "low_threshold_nano": threshold,
        "low_default_nano": usd_to_nano(settings.BALLAST_LOW_BALANCE_USD),
    }
    return render(request, "accounts/overview.html", context, status=status)


@login_required
@require_POST
@post_limited("BALLAST_CODE_REDEEM_RATE", "code_redeem")
def code_redeem(request: HttpRequest) -> HttpResponse:
    """Redeem a credit code (``billing.services.credit_code_redeem``); rate
    limited per address and account (``BALLAST_CODE_REDEEM_RATE``)."""
    form = CreditCodeRedeemForm(request.POST)
    if form.is_valid():
        try:
            txn = credit_code_redeem(user=request.user, code=form.cleaned_data["code"])
        except CreditCodeError as exc:
            form.add_error("code", str(exc))
        else:
            messages.success(request, credit_code_words(txn))
            return redirect("renter:overview")
    return _overview_page(request, status=400, code_form=form)


@login_required
@require_POST
def key_cap_set(request: HttpRequest) -> HttpResponse:
    """Set or remove the spending cap of one of the renter's live keys."""
    form = KeyCapForm(request.POST, user=request.user)
    if not form.is_valid():
        return _overview_page(request, status=400, cap_form=form)
    key, cap = form.cleaned_data["key"], form.cleaned_data["cap_usd"]
    key = api_key_cap_set(
        user=request.user,
        key_id=key.id,
        cap_nano=None if cap is None else usd_to_nano(cap),
        period=form.cleaned_data["period"],
    )
    if key.spend_cap_nano is None:
        messages.success(request, f"The key {key.name} has no spending cap now.")
    else:
        messages.success(
            request,
            f"The key {key.name} may spend {usd_text(key.spend_cap_nano)} "
            f"{key.get_spend_cap_period_display()} "
            f"({usd_text(key.spent_nano)} spent so far).",
        )
    return redirect("renter:overview")


@login_required
@require_POST
def low_balance_set(request: HttpRequest) -> HttpResponse:
    """Set the balance under which the renter is emailed (once per fall)."""
    form = LowBalanceForm(request.POST)
    if not form.is_valid():
        return _overview_page(request, status=400, low_form=form)
    threshold = form.cleaned_data["threshold_usd"]
    balance_low_threshold_set(
        user=request.user,
        threshold_nano=None if threshold is None else usd_to_nano(threshold),
    )
    messages.success(request, "Low-balance email saved.")
    return redirect("renter:overview")


@login_required
@require_POST
def key_create(request: HttpRequest) -> HttpResponse:
    """Create a named API key; the overview shows the plain key once."""
    form = ApiKeyCreateForm(request.POST)
    if form.is_valid():
        key, plain = api_key_create(user=request.user, name=form.cleaned_data["name"])
        request.session[NEW_KEY_SESSION_KEY] = {"name": key.name, "plain": plain}
    else:
        messages.error(request, "Give the key a name.")
    return redirect("renter:overview")


@login_required
@require_POST
def key_revoke(request: HttpRequest, key_id: int) -> HttpResponse:
    """Revoke one of the user's keys; someone else's is a 404."""
    if not services.api_key_revoke(user=request.user, key_id=key_id):
        if not selectors.api_keys_of(user=request.user).filter(id=key_id).exists():
            raise Http404("no such key")
        messages.info(request, "That key was already revoked.")
    else:
        messages.success(request, "Key revoked: requests with it now get 401.")
    return redirect("renter:overview")


@login_required
@require_GET
def jobs(request: HttpRequest) -> HttpResponse:
    """The renter's job log: which key made each job, status, attempts and
    failed_over, time to first token, tokens per second, tokens and cost;
    filtered by status, key, model and dates, ``JOB_LOG_PAGE`` a page."""
    form = JobLogFilterForm(
        request.GET or None,
        user=request.user,
        models=CatalogModel.objects.order_by("id").values_list("id", flat=True),
    )
    filters = form.filters() if form.is_bound else {}
    page = Paginator(
        selectors.job_log(user=request.user, **filters), JOB_LOG_PAGE
    ).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "accounts/jobs.html",
        {
            "form": form,
            "page": page,
            "lines": [selectors.job_line(job) for job in page.object_list],
            "query": query.urlencode(),
        },
    )


@login_required
@require_GET
def job_detail(request: HttpRequest, job_id) -> HttpResponse:
    """One of the renter's jobs with every attempt; another's is a 404."""
    job = selectors.job_of(user=request.user, job_id=job_id)
    return render(
        request, "accounts/job.html", {"job": job, "line": selectors.job_line(job)}
    )


def _rentable_devices(user):
    return devices_rentable(now=timezone.now(), renter=user)[:200]


@login_required
@require_POST
def rental_create(request: HttpRequest) -> HttpResponse:
    """Rent a device for some hours (``jobs.rentals.rental_create``), from the form."""
    try:
        device_id = int(request.POST.get("device", ""))
        hours = int(request.POST.get("hours", ""))
    except ValueError:
        messages.error(request, "Pick a device and a whole number of hours.")
        return redirect("renter:overview")
    try:
        rental = rentals.rental_create(
            renter=request.user, device_id=device_id, hours=hours
        )
    except ApiError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(
            request,
            f"Rental {rental.id} is pending: it goes live once the device passes a spot check.",
        )
    return redirect("renter:overview")


@login_required
@require_POST
def rental_end(request: HttpRequest, rental_id) -> HttpResponse:
    """End one of the user's rentals now (billed up to now); another's is a 404."""
    rental = Rental.objects.filter(id=rental_id, renter=request.user).first()
    if rental is None:
        raise Http404("no such rental")
    rentals.rental_end(rental=rental)
    messages.success(request, "Rental ended.")
    return redirect("renter:overview")
