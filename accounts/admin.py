"""Staff see every model: any model of Ballast's apps that has no hand-written admin
gets a generic read-mostly one (list filters on booleans, choices and dates; search
on text fields). Loaded last (``accounts`` is the last installed app)."""

from __future__ import annotations

from django.apps import apps
from django.contrib import admin
from django.db import models

from accounts.forms import StaffAuthenticationForm

BALLAST_APPS = ("hosts", "jobs", "billing", "support")
FILTER_TYPES = (models.BooleanField, models.DateTimeField, models.DateField)
SEARCH_TYPES = (models.CharField, models.TextField, models.UUIDField)


def generic_admin(model: type[models.Model]) -> type[admin.ModelAdmin]:
    """A ModelAdmin for ``model`` with filters and search chosen from its fields."""
    fields = [f for f in model._meta.concrete_fields]
    display = [f.name for f in fields if not isinstance(f, models.TextField)][:8]
    filters = [
        f.name
        for f in fields
        if isinstance(f, FILTER_TYPES) or (f.choices and not f.primary_key)
    ][:6]
    search = [f.name for f in fields if isinstance(f, SEARCH_TYPES) and not f.choices][
        :6
    ]
    search += [f"{f.name}__id" for f in fields if isinstance(f, models.ForeignKey)][:2]
    return type(
        f"{model.__name__}GenericAdmin",
        (admin.ModelAdmin,),
        {
            "list_display": display,
            "list_filter": filters or ["pk"],
            "search_fields": search or ["pk"],
        },
    )


for app_label in BALLAST_APPS:
    for model in apps.get_app_config(app_label).get_models():
        if not admin.site.is_registered(model):
            admin.site.register(model, generic_admin(model))


# the username createsuperuser asked for, or a site account's email (its
# POSTs rate limited as the site's login: ballast/urls.py)
admin.site.login_form = StaffAuthenticationForm
