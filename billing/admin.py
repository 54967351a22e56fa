"""Staff views of money: the ledger read-only (corrections are new entries), payouts.

Payout requests are decided with admin actions that call the services, so the
ledger moves (host_available → host_paid_out) only through ``payout_approve``.
"""

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from . import admin_credit  # noqa: F401 - registers staff's credit tools
from . import services
from .models import (
    Account,
    Earning,
    Entry,
    LedgerTransaction,
    PayoutRequest,
    ReceiptCheck,
)
from .money import nano_to_usd_str


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class EntryInline(admin.TabularInline):
    model = Entry
    extra = 0
    can_delete = False
    fields = ["account", "amount_nano", "amount_usd"]
    readonly_fields = ["account", "amount_nano", "amount_usd"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="USD")
    def amount_usd(self, obj: Entry) -> str:
        return nano_to_usd_str(obj.amount_nano)


@admin.register(LedgerTransaction)
class LedgerTransactionAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "kind", "key", "job", "leg_count", "memo", "actor"]
    list_filter = ["kind", "created_at", ("actor", admin.EmptyFieldListFilter)]
    search_fields = ["key", "memo", "job__id", "actor__email"]
    date_hierarchy = "created_at"
    inlines = [EntryInline]


@admin.register(Entry)
class EntryAdmin(ReadOnlyAdmin):
    list_display = ["id", "transaction", "account", "amount_nano"]
    list_filter = ["account__kind", "transaction__kind"]
    search_fields = ["account__user__username", "transaction__key"]
    list_select_related = ["transaction", "account"]


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    list_display = ["kind", "user"]
    list_filter = ["kind"]
    search_fields = ["user__username", "user__email"]


@admin.register(Earning)
class EarningAdmin(ReadOnlyAdmin):
    list_display = [
        "attempt",
        "host",
        "device",
        "amount_nano",
        "status",
        "release_at",
        "settled_at",
    ]
    list_filter = ["status", "release_at"]
    search_fields = ["host__username", "attempt__id", "attempt__job__id"]
    list_select_related = ["host", "device__machine"]


@admin.register(ReceiptCheck)
class ReceiptCheckAdmin(ReadOnlyAdmin):
    list_display = ["attempt", "device", "verdict", "created_at"]
    list_filter = ["verdict"]
    search_fields = ["attempt__id", "device__machine__name"]


@admin.register(PayoutRequest)
class PayoutRequestAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "host",
        "amount_usd",
        "status",
        "created_at",
        "decided_by",
        "decided_at",
        "paid_at",
    ]
    list_filter = ["status", "created_at"]
    search_fields = ["host__username", "host__email"]
    readonly_fields = [
        "host",
        "amount_nano",
        "status",
        "note",
        "created_at",
        "decided_at",
        "decided_by",
        "paid_at",
    ]
    actions = ["approve", "reject", "mark_paid"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="amount (USD)")
    def amount_usd(self, obj: PayoutRequest) -> str:
        return nano_to_usd_str(obj.amount_nano)

    def _decide(
        self, request: HttpRequest, queryset: QuerySet, verb: str, call
    ) -> None:
        done = 0
        for payout_id in queryset.values_list("id", flat=True):
            try:
                call(payout_id)
            except services.PayoutError as exc:
                self.message_user(request, str(exc), level=messages.ERROR)
            else:
                done += 1
        if done:
            self.message_user(
                request, f"{done} payout request(s) {verb}.", level=messages.SUCCESS
            )

    @admin.action(description="Approve (moves available → paid out in the ledger)")
    def approve(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._decide(
            request,
            queryset,
            "approved",
            lambda pk: services.payout_approve(payout_id=pk, staff=request.user),
        )

    @admin.action(description="Reject (no money moves)")
    def reject(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._decide(
            request,
            queryset,
            "rejected",
            lambda pk: services.payout_reject(payout_id=pk, staff=request.user),
        )

    @admin.action(description="Mark paid (the money was sent)")
    def mark_paid(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._decide(
            request,
            queryset,
            "marked paid",
            lambda pk: services.payout_mark_paid(payout_id=pk),
        )
