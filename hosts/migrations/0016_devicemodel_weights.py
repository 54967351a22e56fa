"""The weights a device's agent declares it runs, per model (heartbeat
``weights``, docs/protocol-notes.md 2026-12-07): a device whose digest is not
its catalog entry's is not eligible for that model. SQLite adds a NOT NULL
column by rebuilding the table, which the triggers of 0006 do not survive:
they are dropped first and made again after, on SQLite only."""

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
        ("hosts", "0015_outcome_detail_quarantine_decision"),
    ]

    operations = [
        migrations.RunPython(
            _on_sqlite(_ranking.SQLITE_BACKWARD), _on_sqlite(_ranking.SQLITE_FORWARD)
        ),
        migrations.AddField(
            model_name="devicemodel",
            name="weights_sha256",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="sha256 of the file its engine loaded, as its agent declared"
                " it ('' when it did not say: CatalogModel.weights_match)",
                max_length=64,
            ),
        ),
        migrations.AddField(
            model_name="devicemodel",
            name="weights_quantization",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="that file's quantization, as its agent declared it",
                max_length=32,
            ),
        ),
        migrations.RunPython(
            _on_sqlite(_ranking.SQLITE_FORWARD), _on_sqlite(_ranking.SQLITE_BACKWARD)
        ),
    ]
