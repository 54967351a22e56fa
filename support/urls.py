"""Support routes under /support/."""

from django.urls import path

from . import views

app_name = "support"

urlpatterns = [
    path("", views.tickets, name="tickets"),
    path("<int:ticket_id>/", views.ticket, name="ticket"),
]
