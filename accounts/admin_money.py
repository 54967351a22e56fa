"""Money in dollars everywhere in the admin (issue 35: not "COST NANO 1000").

Amounts are stored as integer nano-USD in fields named ``*_nano``
(``billing.money``). Every registered ModelAdmin is given, for each such
field, a column ``<name>_usd`` that shows it as people write money
(``billing.templatetags.billing_money.usd_text``): in lists in place of the
field, and on pages where the field is not editable (a record, or a read-only
field) in its place too. An editable amount (a price, a spending cap) keeps
its input, in nano-USD as its label says, with the dollars beside it.
"""

from __future__ import annotations

from django.contrib import admin
from django.db import models

from billing.templatetags.billing_money import usd_text

SUFFIX = "_nano"


def _money_fields(model: type[models.Model]) -> list[str]:
    return [
        f.name
        for f in model._meta.concrete_fields
        if f.name.endswith(SUFFIX) and isinstance(f, models.BigIntegerField)
    ]


def _usd_name(field: str) -> str:
    return field.removesuffix(SUFFIX) + "_usd"


def _display(field: str, label: str):
    def show(self, obj) -> str:
        value = getattr(obj, field, None)
        return "—" if value is None else usd_text(value)

    show.__name__ = _usd_name(field)
    return admin.display(description=label, ordering=field)(show)


def in_dollars(admin_class: type[admin.ModelAdmin], model) -> type[admin.ModelAdmin]:
    """A subclass of ``admin_class`` that shows ``model``'s ``*_nano`` fields in
    dollars (module docstring); ``admin_class`` itself when it has none."""
    fields = _money_fields(model)
    if not fields:
        return admin_class
    labels = {
        f: model._meta.get_field(f).verbose_name.removesuffix(" nano") for f in fields
    }
    swap = {f: _usd_name(f) for f in fields}

    class Dollars(admin_class):
        def get_list_display(self, request):
            return [swap.get(f, f) for f in super().get_list_display(request)]

        def get_readonly_fields(self, request, obj=None):
            # the originals stay listed: the form never takes a read-only amount
            shown = list(super().get_readonly_fields(request, obj))
            return shown + [swap[f] for f in fields if swap[f] not in shown]

        def get_fields(self, request, obj=None):
            editable = obj is None or self.has_change_permission(request, obj)
            readonly = set(super().get_readonly_fields(request, obj))
            out = []
            for name in super().get_fields(request, obj):
                if name not in swap:
                    out.append(name)
                elif editable and name not in readonly:
                    out += [name, swap[name]]
                else:
                    out.append(swap[name])
            return list(dict.fromkeys(out))  # each once, where it first came

    for field in fields:
        setattr(Dollars, swap[field], _display(field, labels[field]))
    Dollars.__name__ = Dollars.__qualname__ = f"{admin_class.__name__}InDollars"
    return Dollars


def dollars_everywhere(site: admin.AdminSite) -> None:
    """Re-register every ModelAdmin of ``site`` through ``in_dollars``."""
    for model, model_admin in list(site._registry.items()):
        dollars = in_dollars(type(model_admin), model)
        if dollars is not type(model_admin):
            site.unregister(model)
            site.register(model, dollars)
