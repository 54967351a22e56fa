"""Verification rows of a model whose verification is not calibrated yet
(trust.verification.calibration): ``uncalibrated`` (drawn, not verified) and
the ``sample`` verdict (a trusted host's answer scored for the calibration).
Choices only: no column changes."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0020_verification_open_verifier"),
    ]

    operations = [
        migrations.AlterField(
            model_name="verification",
            name="status",
            field=models.CharField(
                choices=[
                    ("offered", "Offered"),
                    ("scored", "Scored"),
                    ("refused", "Refused"),
                    ("expired", "Expired"),
                    ("no_verifier", "No Verifier"),
                    ("uncalibrated", "Uncalibrated"),
                ],
                max_length=12,
            ),
        ),
        migrations.AlterField(
            model_name="verification",
            name="verdict",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "none yet"),
                    ("plausible", "Plausible"),
                    ("confirming", "Confirming"),
                    ("unconfirmed", "Unconfirmed"),
                    ("cleared", "Cleared"),
                    ("failed", "Failed"),
                    ("passed", "Passed"),
                    ("sample", "Sample"),
                ],
                default="",
                max_length=12,
            ),
        ),
    ]
