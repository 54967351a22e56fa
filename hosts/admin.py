"""Staff views of machines and devices, with actions to pause devices; a
device is quarantined or released with a reason on the staff console
(``/staff/devices/<id>/``), which the host reads. Outcomes, checks and history
are records: read-only, never deleted."""

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince

from .models import (
    Benchmark,
    CoordinatorLease,
    Device,
    DeviceModel,
    DeviceOutcome,
    FailedCapability,
    Machine,
    OnlineSpan,
    QuarantineDecision,
    ScoreSample,
)


def console_link(url: str, text: str = "whole picture") -> str:
    """A link to a staff console page, for the admin's lists and pages."""
    return format_html('<a href="{}">{}</a>', url, text)


class DeviceInline(admin.TabularInline):
    model = Device
    extra = 0
    fields = [
        "index",
        "name",
        "vram_total_mb",
        "slots_total",
        "slots_used",
        "score",
        "quarantined",
        "paused",
    ]
    readonly_fields = [
        "index",
        "name",
        "vram_total_mb",
        "slots_total",
        "slots_used",
        "score",
        "quarantined",  # with a reason, on the console
    ]
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False  # devices come from the agent's hello


@admin.register(Machine)
class MachineAdmin(admin.ModelAdmin):
    list_display = [  # the rest are filters: every column fits 1280 px
        "name",
        "owner",
        "region",
        "last_seen",
        "paused",
        "agent_version",
    ]
    list_filter = [
        ("retired_at", admin.EmptyFieldListFilter),
        "connected",
        "paused",
        "host_paused",
        "accepts_serverless",
        "region",
        "engine_name",
        "agent_version",
    ]
    search_fields = ["id", "name", "owner__username", "owner__email", "token_prefix"]
    readonly_fields = [
        "id",
        "token_hash",
        "token_prefix",
        "public_key",
        "channel_name",
        "connected",
        "connected_at",
        "last_heartbeat_at",
        "lease",
        "stale",
        "offline_alert_sent_at",
        "agent_version",
        "engine_name",
        "engine_version",
        "features",
        "created_at",
        "retired_at",
    ]
    list_select_related = ["owner", "lease"]
    inlines = [DeviceInline]
    actions = ["pause_machines", "resume_machines"]

    @admin.display(description="last seen")
    def last_seen(self, obj: Machine) -> str:
        """``live now`` for a machine online now (DESIGN.md rule 1: its
        recorded heartbeat may be older while its process's lease vouches
        for it), else how long ago it was last seen."""
        if obj.is_online(timezone.now()):
            return "live now"
        seen = obj.seen_until()
        return f"{timesince(seen)} ago" if seen else "never"

    @admin.display(description="console")
    def console(self, obj: Machine) -> str:
        return console_link(reverse("staff:machine", args=[obj.id]))

    def get_list_display(self, request):
        return [*super().get_list_display(request), "console"]

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), "last_seen", "console"]

    @admin.action(description="Pause the selected machines (no new jobs)")
    def pause_machines(self, request, queryset: QuerySet[Machine]):
        count = queryset.update(paused=True)
        self.message_user(request, f"{count} machine(s) paused.", messages.SUCCESS)

    @admin.action(description="Resume the selected machines")
    def resume_machines(self, request, queryset: QuerySet[Machine]):
        count = queryset.update(paused=False)
        self.message_user(request, f"{count} machine(s) resumed.", messages.SUCCESS)


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = [
        "label",
        "name",
        "kind",
        "score",
        "quarantined",
        "paused",
        "slots_used",
        "slots_total",
        "temp_c",
        "vram_free_mb",
    ]
    list_filter = [
        "kind",
        "quarantined",
        "quarantine_reason",
        "paused",
        "reference",
        "machine__connected",
        "machine__region",
    ]
    search_fields = ["name", "machine__name", "machine__owner__username"]
    readonly_fields = [
        "machine",
        "index",
        "name",
        "kind",
        "vram_total_mb",
        "vram_free_mb",
        "temp_c",
        "slots_total",
        "slots_used",
        "score",
        "first_seen_at",
        "quarantined",  # with a reason, on the console
        "quarantined_at",
        "quarantine_reason",
    ]
    list_select_related = ["machine"]
    actions = ["pause_devices", "unpause_devices"]

    @admin.display(description="quarantine, release, outcomes")
    def console(self, obj: Device) -> str:
        return console_link(reverse("staff:device", args=[obj.id]), "on the console")

    def get_list_display(self, request):
        return [*super().get_list_display(request), "console"]

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), "console"]

    @admin.action(description="Pause the selected devices (staff: no jobs at all)")
    def pause_devices(self, request, queryset: QuerySet[Device]):
        count = queryset.update(paused=True)
        self.message_user(
            request, f"{count} device(s) paused by staff.", messages.SUCCESS
        )

    @admin.action(description="Unpause the selected devices")
    def unpause_devices(self, request, queryset: QuerySet[Device]):
        count = queryset.update(paused=False)
        self.message_user(request, f"{count} device(s) unpaused.", messages.SUCCESS)


class ReadOnlyMixin:
    """Records written by the platform: staff look, never edit nor delete."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(DeviceModel)
class DeviceModelAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = [
        "device",
        "model_id",
        "loaded",
        "ttft_ms_recent",
        "first_loaded_at",
        "measured_tokens_per_s",
        "measured_jobs",
        "placed_name",
    ]
    list_filter = ["loaded", "model_id"]
    search_fields = ["model_id", "device__name", "device__machine__name"]


@admin.register(DeviceOutcome)
class DeviceOutcomeAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = [
        "created_at",
        "device",
        "source",
        "success",
        "reason",
        "detail",
        "job_ref",
        "model_id",
        "ttft_ms",
    ]
    list_filter = ["source", "success", "reason", "model_id"]
    search_fields = [
        "device__name",
        "device__machine__name",
        "model_id",
        "job_ref",
        "detail",
    ]
    list_select_related = ["device__machine"]
    date_hierarchy = "created_at"


@admin.register(QuarantineDecision)
class QuarantineDecisionAdmin(ReadOnlyMixin, admin.ModelAdmin):
    """Staff's quarantine decisions, made on the console (a record)."""

    list_display = ["created_at", "device", "action", "reason", "staff"]
    list_filter = ["action", "created_at"]
    search_fields = ["device__machine__name", "reason", "staff__email"]
    list_select_related = ["device__machine", "staff"]


@admin.register(FailedCapability)
class FailedCapabilityAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["machine", "device_index", "model_id", "build", "count", "last_at"]
    list_filter = ["model_id", "build"]
    search_fields = ["machine__name", "model_id", "build", "error"]


@admin.register(Benchmark)
class BenchmarkAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = [
        "measured_at",
        "device",
        "model_id",
        "tokens_per_s",
        "ttft_ms",
        "vram_used_mb",
    ]
    list_filter = ["model_id"]
    search_fields = ["device__name", "device__machine__name", "model_id"]


@admin.register(ScoreSample)
class ScoreSampleAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["taken_at", "device", "score"]
    list_filter = ["taken_at"]
    search_fields = ["device__name", "device__machine__name"]


@admin.register(OnlineSpan)
class OnlineSpanAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["machine", "started_at", "ended_at"]
    list_filter = ["ended_at"]
    search_fields = ["machine__name"]


@admin.register(CoordinatorLease)
class CoordinatorLeaseAdmin(ReadOnlyMixin, admin.ModelAdmin):
    """Each coordinator process's liveness lease (``hosts.liveness``)."""

    list_display = ["name", "id", "started_at", "lease_until"]
    list_filter = ["lease_until"]
    search_fields = ["name", "id"]
