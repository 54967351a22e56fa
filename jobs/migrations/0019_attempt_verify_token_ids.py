from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0018_alter_spotcheck_reason"),
    ]

    operations = [
        migrations.AddField(
            model_name="attempt",
            name="verify_token_ids",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
