"""Sign-up and the renter's pages: balance and keys, job log.

Log in/out and password reset are django.contrib.auth's views (``accounts/urls.py``).
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from ballast.ratelimits import post_limited
from billing.services import renter_balance_nano
from jobs.rentals import rental_price_per_hour_nano
from jobs.services import api_key_create

from . import selectors, services
from .forms import ApiKeyCreateForm, SignUpForm

NEW_KEY_SESSION_KEY = "ballast_new_api_key"


@post_limited("BALLAST_SIGNUP_RATE", "signup", field="email")
def signup(request: HttpRequest) -> HttpResponse:
    """Create an account (email + password) and log in (rate limited per
    address and email: ``BALLAST_SIGNUP_RATE``)."""
    if request.user.is_authenticated:
        return redirect("hosts:dashboard")
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(
            request,
            "Welcome to Ballast. Register a machine to host, or create an API key to rent.",
        )
        return redirect("hosts:dashboard")
    return render(request, "registration/signup.html", {"form": form})


@login_required
@require_GET
def overview(request: HttpRequest) -> HttpResponse:
    """The renter's balance, API keys (a new one shown once) and rentals."""
    new_key = request.session.pop(NEW_KEY_SESSION_KEY, None)
    return render(
        request,
        "accounts/overview.html",
        {
            "balance_nano": renter_balance_nano(user=request.user),
            "keys": selectors.api_keys_of(user=request.user),
            "rentals": selectors.rentals_of(user=request.user),
            "rentable": _rentable_devices(request.user),
            "rental_price_nano": rental_price_per_hour_nano(),
            "form": ApiKeyCreateForm(),
            "new_key": new_key,
            "api_base": request.build_absolute_uri("/v1/"),
        },
    )


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
    """The renter's job log: status, failed_over, attempts, tokens and cost."""
    return render(
        request, "accounts/jobs.html", {"jobs": selectors.jobs_of(user=request.user)}
    )


@login_required
@require_GET
def job_detail(request: HttpRequest, job_id) -> HttpResponse:
    """One of the renter's jobs with every attempt; another's is a 404."""
    job = selectors.job_of(user=request.user, job_id=job_id)
    return render(request, "accounts/job.html", {"job": job})


def _rentable_devices(user):
    from django.utils import timezone

    from jobs.selectors import devices_rentable

    return devices_rentable(now=timezone.now(), renter=user)[:200]


@login_required
@require_POST
def rental_create(request: HttpRequest) -> HttpResponse:
    """Rent a device for some hours (``jobs.rentals.rental_create``), from the form."""
    from jobs.errors import ApiError
    from jobs.rentals import rental_create as create

    try:
        device_id = int(request.POST.get("device", ""))
        hours = int(request.POST.get("hours", ""))
    except ValueError:
        messages.error(request, "Pick a device and a whole number of hours.")
        return redirect("renter:overview")
    try:
        rental = create(renter=request.user, device_id=device_id, hours=hours)
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
    from jobs.models import Rental
    from jobs.rentals import rental_end as end

    rental = Rental.objects.filter(id=rental_id, renter=request.user).first()
    if rental is None:
        raise Http404("no such rental")
    end(rental=rental)
    messages.success(request, "Rental ended.")
    return redirect("renter:overview")
