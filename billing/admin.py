"""Staff views of the ledger (read-only: corrections are new entries)."""

from django.contrib import admin

from .models import Account, Earning, Entry, LedgerTransaction


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class EntryInline(admin.TabularInline):
    model = Entry
    extra = 0
    can_delete = False
    readonly_fields = ["account", "amount_nano"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(LedgerTransaction)
class LedgerTransactionAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "kind", "key", "job", "memo"]
    list_filter = ["kind"]
    search_fields = ["key", "memo"]
    inlines = [EntryInline]


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    list_display = ["kind", "user"]
    list_filter = ["kind"]


@admin.register(Earning)
class EarningAdmin(ReadOnlyAdmin):
    list_display = ["attempt", "host", "device", "amount_nano", "status", "release_at"]
    list_filter = ["status"]
