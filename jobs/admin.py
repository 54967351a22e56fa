"""Staff views of the catalog, keys, jobs and attempts."""

from django.contrib import admin

from .models import ApiKey, Attempt, CatalogModel, Job


@admin.register(CatalogModel)
class CatalogModelAdmin(admin.ModelAdmin):
    list_display = ["id", "family", "context_length", "vram_per_request_mb", "price_completion_nano", "active"]
    list_filter = ["family", "active"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "name", "user", "created_at", "last_used_at", "revoked_at"]
    search_fields = ["prefix", "user__username"]
    readonly_fields = ["key_hash", "prefix"]


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = ["device", "kind", "state", "outcome", "offered_at", "claimed_at", "first_token_at", "ended_at", "output_chars", "tokens_billed", "receipt_valid"]
    readonly_fields = fields


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["id", "renter", "model_id", "status", "failed_over", "is_spot_check", "tokens_billed", "created_at"]
    list_filter = ["status", "failed_over", "is_spot_check", "model_id"]
    search_fields = ["id", "renter__username"]
    inlines = [AttemptInline]


@admin.register(Attempt)
class AttemptAdmin(admin.ModelAdmin):
    list_display = ["id", "job", "device", "kind", "state", "outcome", "tokens_billed", "receipt_valid", "token_count_flagged"]
    list_filter = ["state", "outcome", "kind", "receipt_valid", "token_count_flagged"]
