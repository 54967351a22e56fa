"""``CatalogModel`` now belongs to the catalog app (catalog 0001): drop it from the
jobs app's state only. Its table, jobs_catalogmodel, and its rows stay; no field of
jobs, hosts or billing is a foreign key to it (``model_id`` columns are plain text).
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("catalog", "0001_initial"),
        ("jobs", "0009_job_indexes_trimmed"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="CatalogModel")],
            database_operations=[],
        ),
    ]
