"""Staff views of verification's calibration per model: read-only records
(``trust.verification.calibration`` writes them); deleting a model's
calibration has it derived again from its samples, or waits for them."""

from django.contrib import admin

from .models import CalibrationSample, ModelCalibration


@admin.register(ModelCalibration)
class ModelCalibrationAdmin(admin.ModelAdmin):
    list_display = [
        "model",
        "quantization",
        "source",
        "samples",
        "z_min",
        "outside_base",
        "greedy_misses_share",
        "calibrated_at",
    ]
    list_filter = ["source"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(CalibrationSample)
class CalibrationSampleAdmin(admin.ModelAdmin):
    list_display = [
        "model",
        "quantization",
        "temperature",
        "n",
        "z",
        "misses",
        "outside",
    ]
    list_filter = ["model", "quantization"]
    raw_id_fields = ["verification"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
