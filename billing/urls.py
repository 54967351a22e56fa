"""Pages of billing: statement, earnings, payout requests."""

from django.urls import path

from . import views

app_name = "billing"

urlpatterns = [
    path("statement/", views.statement, name="statement"),
    path("statement.csv", views.statement_csv, name="statement_csv"),
    path("earnings/", views.earnings, name="earnings"),
    path("earnings/payouts/", views.payout_create, name="payout_create"),
]
