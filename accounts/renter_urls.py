"""The renter's pages under /renter/: balance and keys, job log."""

from django.urls import path

from . import views

app_name = "renter"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("keys/", views.key_create, name="key_create"),
    path("keys/<int:key_id>/revoke/", views.key_revoke, name="key_revoke"),
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/<uuid:job_id>/", views.job_detail, name="job"),
]
