"""Staff views of keys, jobs and attempts (attempts and receipts read-only).
Jobs, attempts, spot checks, verifications and rentals are records of what
happened and was billed: never deleted here."""

from django.contrib import admin, messages
from django.utils import timezone

from .models import (
    ApiKey,
    Attempt,
    CanaryPrompt,
    Job,
    Rental,
    SpotCheck,
    Verification,
)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = [
        "prefix",
        "name",
        "user",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter), "created_at"]
    search_fields = ["prefix", "name", "user__username", "user__email"]
    readonly_fields = [
        "key_hash",
        "prefix",
        "user",
        "created_at",
        "last_used_at",
        "last_empty_answer_at",
    ]
    actions = ["revoke_keys"]

    def has_add_permission(self, request):
        return False  # keys are created by their renter (shown once) or renter_create

    @admin.action(description="Revoke the selected keys")
    def revoke_keys(self, request, queryset):
        count = queryset.filter(revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        self.message_user(request, f"{count} key(s) revoked.", messages.SUCCESS)


ATTEMPT_FIELDS = [
    "device",
    "kind",
    "state",
    "outcome",
    "offered_at",
    "claimed_at",
    "first_token_at",
    "ended_at",
    "output_chars",
    "tokens_billed",
    "completion_tokens_reported",
    "receipt_valid",
    "token_count_flagged",
]


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = ATTEMPT_FIELDS
    readonly_fields = fields
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = [  # (is_spot_check: a filter; every column fits 1280 px)
        "created_at",
        "id",
        "renter",
        "model_id",
        "status",
        "failed_over",
        "tokens_billed",
        "cost_nano",
    ]
    list_filter = [
        "status",
        "failed_over",
        "is_spot_check",
        "model_id",
        "endpoint",
        "created_at",
    ]
    search_fields = [
        "id",
        "renter__username",
        "renter__email",
        "model_id",
        "error_code",
    ]
    date_hierarchy = "created_at"
    list_select_related = ["renter"]
    inlines = [AttemptInline]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # a job is a record of what happened and what was billed

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Attempt)
class AttemptAdmin(admin.ModelAdmin):
    """Attempts and their receipts are read-only: they are what was billed and paid."""

    list_display = [
        "id",
        "job",
        "device",
        "kind",
        "state",
        "outcome",
        "tokens_billed",
        "receipt_valid",
        "token_count_flagged",
    ]
    list_filter = ["state", "outcome", "kind", "receipt_valid", "token_count_flagged"]
    search_fields = ["id", "job__id", "device__name", "device__machine__name"]
    list_select_related = ["job", "device", "device__machine"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(CanaryPrompt)
class CanaryPromptAdmin(admin.ModelAdmin):
    """The spot-check pool (staff only: never shown to a host)."""

    list_display = [
        "model_id",
        "index",
        "family",
        "endpoint",
        "expected",
        "status",
        "sent_count",
        "calibrated_at",
    ]
    list_filter = ["model_id", "status", "family", "endpoint"]
    search_fields = ["expected", "prompt"]
    readonly_fields = [f.name for f in CanaryPrompt._meta.fields]

    def has_add_permission(self, request):
        return False


@admin.register(SpotCheck)
class SpotCheckAdmin(admin.ModelAdmin):
    list_display = ["created_at", "device", "reason", "passed", "detail"]
    list_filter = ["reason", "passed"]
    search_fields = ["device__name", "device__machine__name", "detail"]
    readonly_fields = [
        "device",
        "canary",
        "job",
        "reason",
        "passed",
        "detail",
        "judged_at",
    ]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Verification)
class VerificationAdmin(admin.ModelAdmin):
    """Verifications of real answers and checks of verifiers (those have a
    ``canary`` and ``expected_plausible``; staff only: no host page lists them)."""

    list_display = [
        "offered_at",
        "job",
        "device",
        "verifier",
        "round",
        "status",
        "verdict",
        "plausible",
        "expected_plausible",
        "verifier_trusted",
        "detail",
    ]
    list_filter = ["status", "verdict", "round", "verifier_trusted"]
    search_fields = ["detail", "device__machine__name", "verifier__machine__name"]
    readonly_fields = [f.name for f in Verification._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Rental)
class RentalAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "renter",
        "device",
        "status",
        "hours",
        "starts_at",
        "ends_at",
        "last_pass_at",
    ]
    list_filter = ["status"]
    search_fields = ["id", "renter__username", "device__machine__name"]

    def has_add_permission(self, request):
        return False  # a renter rents from their page

    def has_change_permission(self, request, obj=None):
        return False  # its status moves only through jobs.rentals

    def has_delete_permission(self, request, obj=None):
        return False  # what a renter was billed for, and a host paid
