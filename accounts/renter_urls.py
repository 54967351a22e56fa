"""The renter's pages under /renter/: balance, credit, keys and caps, job log."""

from django.urls import path

from . import views

app_name = "renter"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("keys/", views.key_create, name="key_create"),
    path("keys/<int:key_id>/revoke/", views.key_revoke, name="key_revoke"),
    path("keys/cap/", views.key_cap_set, name="key_cap_set"),
    path("credit/code/", views.code_redeem, name="code_redeem"),
    path("credit/low-balance/", views.low_balance_set, name="low_balance_set"),
    path("jobs/", views.jobs, name="jobs"),
    path("rentals/", views.rental_create, name="rental_create"),
    path("rentals/<uuid:rental_id>/end/", views.rental_end, name="rental_end"),
    path("jobs/<uuid:job_id>/", views.job_detail, name="job"),
]
