"""Placement by what was measured (docs/design-notes.md "Placement by what was
measured"): a device's declared ``kind`` (gpu/cpu), the coordinator's own
measurements of its jobs, and what they allow placement per model. SQLite
adds a NOT NULL column by rebuilding the table, which the triggers of 0006 do
not survive: they are dropped first and made again after, on SQLite only."""

import importlib

import django.db.models.deletion
from django.db import migrations, models

_ranking = importlib.import_module("hosts.migrations.0006_devicemodel_ranking")


def _on_sqlite(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "sqlite":
            for sql in statements:
                schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ("hosts", "0012_verifier_checks"),
    ]

    operations = [
        migrations.RunPython(
            _on_sqlite(_ranking.SQLITE_BACKWARD), _on_sqlite(_ranking.SQLITE_FORWARD)
        ),
        migrations.AddField(
            model_name="device",
            name="kind",
            field=models.CharField(
                choices=[("gpu", "GPU"), ("cpu", "CPU")],
                db_default="gpu",
                default="gpu",
                max_length=8,
            ),
        ),
        migrations.AddField(
            model_name="devicemodel",
            name="measured_tokens_per_s",
            field=models.FloatField(
                blank=True,
                help_text="median tokens/s of its latest measured jobs of the model"
                " (offer to done, by the coordinator); null until enough were measured",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="devicemodel",
            name="measured_jobs",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="devicemodel",
            name="placed_name",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="the device name its measured speed was found consistent"
                " with (placed by gpu/min_vram_gb while the device keeps it); '' if not",
                max_length=200,
            ),
        ),
        migrations.AddField(
            model_name="devicemodel",
            name="placed_vram_mb",
            field=models.PositiveIntegerField(
                db_default=0,
                default=0,
                help_text="VRAM credited for min_vram_gb: declared, up to its class's",
            ),
        ),
        migrations.CreateModel(
            name="Measurement",
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
                ("model_id", models.CharField(max_length=100)),
                ("tokens", models.PositiveIntegerField()),
                ("seconds", models.FloatField()),
                ("measured_at", models.DateTimeField()),
                (
                    "device",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="measurements",
                        to="hosts.device",
                    ),
                ),
            ],
            options={
                "ordering": ["-measured_at", "-id"],
                "indexes": [
                    models.Index(
                        fields=["device", "model_id", "-id"],
                        name="measurement_device_model",
                    )
                ],
            },
        ),
        migrations.RunPython(
            _on_sqlite(_ranking.SQLITE_FORWARD), _on_sqlite(_ranking.SQLITE_BACKWARD)
        ),
    ]
