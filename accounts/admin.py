"""Staff see every model: any model of Ballast's apps that has no hand-written admin
gets a generic read-only one (list filters on booleans, choices and dates; search
on text fields: what the platform wrote is a record). Every amount shows in
dollars (``accounts.admin_money``); a user links to their whole picture on the
staff console. Loaded last (``accounts`` is the last installed app)."""

from __future__ import annotations

from django.apps import apps
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db import models
from django.urls import reverse
from django.utils.html import format_html

from accounts.admin_money import dollars_everywhere
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
            "has_add_permission": lambda self, request, obj=None: False,
            "has_change_permission": lambda self, request, obj=None: False,
            "has_delete_permission": lambda self, request, obj=None: False,
        },
    )


class UserWithPictureAdmin(UserAdmin):
    """Django's user admin, each user linked to their whole picture (keys,
    jobs, credit, tickets, machines) on the staff console."""

    @admin.display(description="whole picture")
    def picture(self, obj) -> str:
        return format_html(
            '<a href="{}">on the console</a>', reverse("staff:renter", args=[obj.pk])
        )

    def get_list_display(self, request):
        return [*super().get_list_display(request), "picture"]

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), "picture"]


for app_label in BALLAST_APPS:
    for model in apps.get_app_config(app_label).get_models():
        if not admin.site.is_registered(model):
            admin.site.register(model, generic_admin(model))

if isinstance(admin.site._registry.get(get_user_model()), UserAdmin):
    admin.site.unregister(get_user_model())
    admin.site.register(get_user_model(), UserWithPictureAdmin)
dollars_everywhere(admin.site)
# the lists get the page's width (the sidebar pushed their last columns, the
# cost among them, into a strip scrolling sideways at 1280 px)
admin.site.enable_nav_sidebar = False


# the username createsuperuser asked for, or a site account's email (its
# POSTs rate limited as the site's login: ballast/urls.py)
admin.site.login_form = StaffAuthenticationForm
