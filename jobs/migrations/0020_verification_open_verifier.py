from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0019_attempt_verify_token_ids"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="verification",
            index=models.Index(
                condition=models.Q(("status", "offered")),
                fields=["verifier"],
                name="verification_open_verifier",
            ),
        ),
    ]
