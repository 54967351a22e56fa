"""Routes of the staff console (``/staff/``)."""

from django.urls import path

from . import views

app_name = "staff"

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("find/", views.find, name="find"),
    path("renters/<int:user_id>/", views.renter, name="renter"),
    path("machines/<uuid:machine_id>/", views.machine, name="machine"),
    path("devices/<int:device_id>/", views.device, name="device"),
    path("devices/<int:device_id>/decide/", views.device_decide, name="device_decide"),
]
