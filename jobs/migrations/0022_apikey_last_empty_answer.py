"""``ApiKey.last_empty_answer_at``: when an answer of the key last came back
empty, so that a request of a key with none in ``BALLAST_EMPTY_ANSWER_RATE``'s
window skips the limit's counter (jobs.services.requests.key_empty_answers_check).
A nullable column: no table rewrite. The keys that exist have their empty
answers counted only in the counter: their time is set to the migration's,
so their counter is asked for one more window (a key the counter holds full
stays refused)."""

from django.db import migrations, models
from django.utils import timezone


def existing_keys_ask_the_counter(apps, schema_editor):
    ApiKey = apps.get_model("jobs", "ApiKey")
    ApiKey.objects.update(last_empty_answer_at=timezone.now())


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
        migrations.RunPython(existing_keys_ask_the_counter, migrations.RunPython.noop),
    ]
