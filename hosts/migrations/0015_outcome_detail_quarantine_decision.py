"""A device outcome keeps its job's id and the finding in words (issue 35:
"why was my device quarantined?" answered from the row, not the log), and
staff's quarantine decisions with the reason the host reads
(``hosts.models.QuarantineDecision``)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("hosts", "0014_machine_trust"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="failedcapability",
            options={"verbose_name_plural": "failed capabilities"},
        ),
        migrations.AddField(
            model_name="deviceoutcome",
            name="job_ref",
            field=models.CharField(
                blank=True, db_default="", default="", help_text="job id", max_length=36
            ),
        ),
        migrations.AddField(
            model_name="deviceoutcome",
            name="detail",
            field=models.CharField(
                blank=True, db_default="", default="", max_length=300
            ),
        ),
        migrations.CreateModel(
            name="QuarantineDecision",
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
                (
                    "action",
                    models.CharField(
                        choices=[
                            ("quarantine", "quarantined"),
                            ("release", "released from quarantine"),
                        ],
                        max_length=12,
                    ),
                ),
                ("reason", models.CharField(max_length=500)),
                ("created_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                (
                    "device",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="quarantine_decisions",
                        to="hosts.device",
                    ),
                ),
                (
                    "staff",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={"ordering": ["-created_at", "-id"]},
        ),
    ]
