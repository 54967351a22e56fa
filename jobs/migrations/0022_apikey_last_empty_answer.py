"""``ApiKey.last_empty_answer_at``: when an answer of the key last came back
empty, so that a request of a key with none in ``BALLAST_EMPTY_ANSWER_RATE``'s
window skips the limit's counter (jobs.services.requests.key_empty_answers_check).
A nullable column: no table rewrite."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0021_verification_calibration"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="last_empty_answer_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
