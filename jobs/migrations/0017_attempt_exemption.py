from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0016_rental_pauses"),
    ]

    operations = [
        migrations.AddField(
            model_name="attempt",
            name="exemption",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "verified whole"),
                    ("stop_cut", "its last token, cut by a stop sequence"),
                    ("cut_character", "bytes that are no character (U+FFFD)"),
                ],
                default="",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="attempt",
            name="verify_text",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(
                fields=["device", "ended_at"], name="attempt_device_ended"
            ),
        ),
    ]
