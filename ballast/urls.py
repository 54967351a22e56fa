"""URL routes: renter API under /v1/, pages, admin, OpenAPI schema, staff metrics,
the load balancer's health check."""

from django.contrib import admin
from django.http import HttpResponse
from django.shortcuts import redirect
from django.templatetags.static import static
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView

from accounts.views import models_page
from ballast.metrics_view import metrics
from ballast.ratelimits import post_limited
from jobs.views import not_found


def favicon(request):
    """``/favicon.ico``, which browsers ask for on pages that name no icon (the
    admin's): the static icon under its hashed name."""
    return redirect(static("favicon.svg"), permanent=True)


async def healthz(request):
    """``GET /healthz``: 200 ``ok`` while this process serves HTTP, for a load
    balancer's health check (``deploy/haproxy.cfg``). It reads no database: a
    PostgreSQL or Redis outage must not mark every process down at once."""
    return HttpResponse("ok", content_type="text/plain")


urlpatterns = [
    path("favicon.ico", favicon),
    path("healthz", healthz, name="healthz"),
    # the admin's login, its POSTs rate limited as the site's (accounts/urls.py)
    path(
        "admin/login/",
        post_limited("BALLAST_LOGIN_RATE", "login", field="username")(admin.site.login),
    ),
    path("admin/", admin.site.urls),
    path("staff/", include("staff.urls")),
    path("models/", models_page, name="models_page"),
    path("v1/", include("jobs.urls")),
    # a client's base URL ending in a slash asks for //v1/…: the API's JSON 404,
    # not an HTML page
    re_path(r"^/+v1/", not_found),
    path("metrics", metrics, name="metrics"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("billing/", include(("billing.urls", "billing"))),
    path("accounts/", include("accounts.urls")),
    path("renter/", include("accounts.renter_urls")),
    path("support/", include("support.urls")),
    path("", include("hosts.urls")),
]
