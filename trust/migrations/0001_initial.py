"""Verification calibrated per catalog entry (trust.verification.calibration).

SmolLM2-135M-Instruct's entry gets the thresholds its verification judged by
until now (trust.verification.plausibility's constants, REFERENCE_THRESHOLDS:
calibrated on 120 honest Q4_1 answers at T 0, 0.7 and 1, docs/trust.md
"Calibration"), for the weights it pins (Q4_1), written here as data so that
nothing changes for it. Every other entry is calibrated from its fleet's
honest answers."""

from django.db import migrations, models
import django.db.models.deletion
import django.utils.timezone

REFERENCE_ID = "smollm2-135m-instruct"
REFERENCE = {
    "greedy_misses_base": 2.0,
    "greedy_misses_share": 0.10,
    "outside_base": 2.0,
    "outside_share": 0.02,
    "z_min": -4.0,
    "z_low": 0.5,
    "z_high": 1.0,
    "samples": 120,
    "source": "reference",
}


def reference_calibrate(apps, schema_editor):
    CatalogModel = apps.get_model("catalog", "CatalogModel")
    ModelCalibration = apps.get_model("trust", "ModelCalibration")
    db = schema_editor.connection.alias
    model = (
        CatalogModel.objects.using(db)
        .filter(id=REFERENCE_ID, quantization__in=("Q4_1", ""))
        .first()
    )
    if model is None:
        return
    ModelCalibration.objects.using(db).update_or_create(
        model=model,
        defaults={
            **REFERENCE,
            "weights_sha256": model.weights_sha256,
            "quantization": model.quantization,
        },
    )


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("catalog", "0003_weights"),
        ("jobs", "0021_verification_calibration"),
    ]

    operations = [
        migrations.CreateModel(
            name="ModelCalibration",
            fields=[
                (
                    "model",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="calibration",
                        serialize=False,
                        to="catalog.catalogmodel",
                    ),
                ),
                ("weights_sha256", models.CharField(blank=True, max_length=64)),
                ("quantization", models.CharField(blank=True, max_length=32)),
                ("greedy_misses_base", models.FloatField()),
                ("greedy_misses_share", models.FloatField()),
                ("outside_base", models.FloatField()),
                ("outside_share", models.FloatField()),
                ("z_min", models.FloatField()),
                ("z_low", models.FloatField(blank=True, null=True)),
                ("z_high", models.FloatField(blank=True, null=True)),
                ("samples", models.PositiveIntegerField(default=0)),
                (
                    "source",
                    models.CharField(
                        choices=[("reference", "Reference"), ("fleet", "Fleet")],
                        max_length=12,
                    ),
                ),
                (
                    "calibrated_at",
                    models.DateTimeField(default=django.utils.timezone.now),
                ),
            ],
        ),
        migrations.CreateModel(
            name="CalibrationSample",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True,
                        primary_key=True,
                        serialize=False,
                        verbose_name="ID",
                    ),
                ),
                ("weights_sha256", models.CharField(blank=True, max_length=64)),
                ("quantization", models.CharField(blank=True, max_length=32)),
                ("temperature", models.FloatField()),
                ("n", models.PositiveIntegerField()),
                ("z", models.FloatField()),
                ("misses", models.PositiveIntegerField()),
                ("outside", models.PositiveIntegerField()),
                (
                    "created_at",
                    models.DateTimeField(default=django.utils.timezone.now),
                ),
                (
                    "model",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="samples",
                        to="catalog.catalogmodel",
                    ),
                ),
                (
                    "verification",
                    models.OneToOneField(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="calibration_sample",
                        to="jobs.verification",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        fields=["model", "weights_sha256", "quantization"],
                        name="calibration_sample_weights",
                    )
                ],
            },
        ),
        migrations.RunPython(reference_calibrate, migrations.RunPython.noop),
    ]
