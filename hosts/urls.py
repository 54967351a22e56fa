"""Pages of hosts (dashboard, machine pages)."""

from django.urls import path

from . import views

app_name = "hosts"

urlpatterns = [
    path("", views.home, name="home"),
    path("machines/", views.dashboard, name="dashboard"),
    path("machines/rows/", views.machine_rows, name="machine_rows"),
    path("machines/new/", views.machine_register, name="machine_register"),
    path("machines/<uuid:machine_id>/", views.machine_page, name="machine"),
    path("machines/<uuid:machine_id>/devices/", views.device_rows, name="device_rows"),
    path(
        "machines/<uuid:machine_id>/pause/", views.machine_pause, name="machine_pause"
    ),
    path(
        "machines/<uuid:machine_id>/settings/",
        views.machine_settings,
        name="machine_settings",
    ),
    path(
        "machines/<uuid:machine_id>/rename/",
        views.machine_rename,
        name="machine_rename",
    ),
    path(
        "machines/<uuid:machine_id>/retire/",
        views.machine_retire,
        name="machine_retire",
    ),
    path(
        "machines/<uuid:machine_id>/reset-key/",
        views.machine_key_reset,
        name="machine_key_reset",
    ),
    path(
        "machines/<uuid:machine_id>/token/rotate/",
        views.machine_token_rotate,
        name="machine_token_rotate",
    ),
    path(
        "machines/<uuid:machine_id>/token/revoke/",
        views.machine_token_revoke,
        name="machine_token_revoke",
    ),
]
