"""Staff answer tickets here."""

from django.contrib import admin

from .models import Ticket, TicketMessage


class TicketMessageInline(admin.StackedInline):
    model = TicketMessage
    extra = 1


@admin.register(Ticket)
class TicketAdmin(admin.ModelAdmin):
    list_display = ["subject", "author", "status", "created_at"]
    list_filter = ["status"]
    search_fields = ["subject", "author__username"]
    inlines = [TicketMessageInline]
