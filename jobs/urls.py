"""Renter API routes under ``/v1/``."""

from django.urls import path, re_path

from . import apis, views

urlpatterns = [
    path("models", apis.ModelsApi.as_view(), name="models"),
    path("models/<path:model_id>", apis.ModelApi.as_view(), name="model"),
    path("chat/completions", views.chat_completions, name="chat-completions"),
    path("completions", views.completions, name="completions"),
    path("jobs/<str:job_id>", apis.JobApi.as_view(), name="job"),
    path("usage", apis.UsageApi.as_view(), name="usage"),
    path("devices", apis.DevicesApi.as_view(), name="devices"),
    path("rentals", apis.RentalsApi.as_view(), name="rentals"),
    path("rentals/<str:rental_id>", apis.RentalApi.as_view(), name="rental"),
    # any other path, a newline in it too (``.*`` stops at one)
    re_path(r"^[\s\S]*$", views.not_found, name="v1-not-found"),
]
