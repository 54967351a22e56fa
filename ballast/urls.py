"""URL routes: renter API under /v1/, pages, admin, OpenAPI schema."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("v1/", include("jobs.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("billing/", include(("billing.urls", "billing"))),
    path("accounts/", include("accounts.urls")),
    path("renter/", include("accounts.renter_urls")),
    path("support/", include("support.urls")),
    path("", include("hosts.urls")),
]
