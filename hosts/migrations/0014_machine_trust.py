"""What a machine and its owner carry whatever a device is called
(hosts.services.trust): why a device is quarantined (which says how it leaves),
and when a new machine of an owner with a quarantined device came under
suspicion. SQLite adds the NOT NULL column by rebuilding ``hosts_device``,
whose ranking triggers (0006) do not survive it: they are dropped first and
made again after, on SQLite only (as 0012 and 0013 do)."""

import importlib

from django.db import migrations, models

_ranking = importlib.import_module("hosts.migrations.0006_devicemodel_ranking")


def _on_sqlite(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "sqlite":
            for sql in statements:
                schema_editor.execute(sql, params=None)

    return run


def _reasons_forward(apps, schema_editor):
    """Devices quarantined before reasons existed were quarantined by their
    failures (or staff, who release them in the admin either way)."""
    Device = apps.get_model("hosts", "Device")
    Device.objects.filter(quarantined=True).update(quarantine_reason="failures")


class Migration(migrations.Migration):
    dependencies = [
        ("hosts", "0013_device_kind_measurements"),
    ]

    operations = [
        migrations.RunPython(
            _on_sqlite(_ranking.SQLITE_BACKWARD), _on_sqlite(_ranking.SQLITE_FORWARD)
        ),
        migrations.AddField(
            model_name="device",
            name="quarantine_reason",
            field=models.CharField(
                blank=True,
                choices=[
                    ("failures", "failed checks or a score under 50"),
                    ("staff", "quarantined by staff"),
                    ("inherited", "a device of its machine is quarantined"),
                    (
                        "new_device",
                        "new to a machine that had devices: checked first",
                    ),
                ],
                db_default="",
                default="",
                help_text="why it is quarantined ('' when it is not)",
                max_length=16,
            ),
        ),
        migrations.RunPython(
            _on_sqlite(_ranking.SQLITE_FORWARD), _on_sqlite(_ranking.SQLITE_BACKWARD)
        ),
        migrations.AddField(
            model_name="machine",
            name="suspected_at",
            field=models.DateTimeField(
                blank=True,
                help_text="under suspicion from its first hello: its owner had a"
                " quarantined device then (hosts.services.trust.machine_suspected_since)",
                null=True,
            ),
        ),
        migrations.RunPython(_reasons_forward, migrations.RunPython.noop),
    ]
