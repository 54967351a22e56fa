"""Staff answer tickets here: a new message added by staff emails the ticket's author."""

from django.contrib import admin

from . import services
from .models import Ticket, TicketMessage


class TicketMessageInline(admin.StackedInline):
    model = TicketMessage
    extra = 1
    fields = ["author", "body", "created_at"]
    readonly_fields = ["author", "created_at"]

    def has_change_permission(self, request, obj=None):
        return False  # the conversation is a record; staff add replies, never edit them

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Ticket)
class TicketAdmin(admin.ModelAdmin):
    list_display = ["subject", "author", "status", "created_at"]
    list_filter = ["status", "created_at"]
    search_fields = ["subject", "author__username", "author__email", "messages__body"]
    readonly_fields = ["author", "created_at"]
    inlines = [TicketMessageInline]

    def save_formset(self, request, form, formset, change):
        """New messages are written as the staff member and email the author."""
        instances = formset.save(commit=False)
        for message in instances:
            if message.pk is None:
                message.author = request.user
                message.save()
                services.ticket_after_message(message=message)
        formset.save_m2m()


@admin.register(TicketMessage)
class TicketMessageAdmin(admin.ModelAdmin):
    list_display = ["ticket", "author", "created_at"]
    list_filter = ["created_at"]
    search_fields = ["body", "ticket__subject", "author__username"]
    readonly_fields = ["ticket", "author", "body", "created_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # the conversation is a record

    def has_delete_permission(self, request, obj=None):
        return False
