"""The admin says "entries" (issue 35)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("billing", "0006_platform_checks_account")]

    operations = [
        migrations.AlterModelOptions(
            name="entry", options={"verbose_name_plural": "entries"}
        ),
    ]
