"""Checks of devices as verifiers (jobs.verification.checks): when the next is
due, and how many passed in a row. SQLite adds a NOT NULL column by rebuilding
the table, which its triggers on ``hosts_device`` (0006) do not survive: they
are dropped first and made again after, on SQLite only."""

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
        ("hosts", "0011_machine_verifies"),
    ]

    operations = [
        migrations.RunPython(
            _on_sqlite(_ranking.SQLITE_BACKWARD), _on_sqlite(_ranking.SQLITE_FORWARD)
        ),
        migrations.AddField(
            model_name="device",
            name="verifier_check_due_at",
            field=models.DateTimeField(
                blank=True,
                db_index=True,
                help_text="a check of this device as a verifier is to be sent after this",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="device",
            name="verifier_passes",
            field=models.PositiveIntegerField(
                default=0,
                help_text="checks as a verifier passed since its last failed one"
                " (trusted from BALLAST_VERIFIER_TRUST_PASSES)",
            ),
        ),
        migrations.RunPython(
            _on_sqlite(_ranking.SQLITE_FORWARD), _on_sqlite(_ranking.SQLITE_BACKWARD)
        ),
    ]
