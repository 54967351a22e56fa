"""A reference device, marked by staff: trusted to establish the answers of
spot checks for models the coordinator cannot run (issue 31 item 4,
``jobs.canaryfleet``). SQLite adds the column by rebuilding the table, which
the triggers of 0006 do not survive: they are dropped first and made again
after, on SQLite only (as 0013 does)."""

import importlib

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
        ("hosts", "0016_devicemodel_weights"),
    ]

    operations = [
        migrations.RunPython(
            _on_sqlite(_ranking.SQLITE_BACKWARD), _on_sqlite(_ranking.SQLITE_FORWARD)
        ),
        migrations.AddField(
            model_name="device",
            name="reference",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="a reference device, marked by staff: trusted to establish"
                " the answers of spot checks for models the coordinator cannot run",
            ),
        ),
        migrations.RunPython(
            _on_sqlite(_ranking.SQLITE_FORWARD), _on_sqlite(_ranking.SQLITE_BACKWARD)
        ),
    ]
