"""Staff view of the catalog: its models, sizes and prices (editable)."""

from django.contrib import admin

from .models import CatalogModel


@admin.register(CatalogModel)
class CatalogModelAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "family",
        "context_length",
        "vram_per_request_mb",
        "price_prompt_nano",
        "price_completion_nano",
        "active",
    ]
    list_filter = ["family", "active"]
    search_fields = ["id", "family"]
