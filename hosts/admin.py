"""Staff views of machines and devices."""

from django.contrib import admin

from .models import Benchmark, Device, DeviceModel, DeviceOutcome, FailedCapability, Machine


class DeviceInline(admin.TabularInline):
    model = Device
    extra = 0
    fields = ["index", "name", "vram_total_mb", "slots_total", "slots_used", "score", "quarantined", "paused"]


@admin.register(Machine)
class MachineAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "region", "connected", "last_heartbeat_at", "paused", "agent_version", "engine_name"]
    list_filter = ["connected", "paused", "region", "engine_name"]
    search_fields = ["name", "owner__username"]
    readonly_fields = ["token_hash", "token_prefix", "public_key", "channel_name"]
    inlines = [DeviceInline]


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ["label", "name", "score", "quarantined", "paused", "slots_used", "slots_total", "temp_c"]
    list_filter = ["quarantined", "paused"]
    search_fields = ["name", "machine__name"]


admin.site.register(DeviceModel)
admin.site.register(DeviceOutcome)
admin.site.register(FailedCapability)
admin.site.register(Benchmark)
