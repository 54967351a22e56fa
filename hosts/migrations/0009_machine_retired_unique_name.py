"""Machines: ``retired_at``, a region validator, and names unique per owner.

Existing duplicates (same owner, same name whatever its case) are renamed
before the constraint is added: the oldest keeps its name, the others get
" (2)", " (3)", … (cut to fit 100 characters).
"""

import django.db.models.functions.text
from django.db import migrations, models

import hosts.regions

NAME_MAX = 100


def _free_name(name: str, taken: set[str]) -> str:
    n = 2
    while True:
        suffix = f" ({n})"
        candidate = name[: NAME_MAX - len(suffix)] + suffix
        if candidate.lower() not in taken:
            return candidate
        n += 1


def names_deduplicate(apps, schema_editor):
    Machine = apps.get_model("hosts", "Machine")
    by_owner: dict[int, list] = {}
    for machine in Machine.objects.order_by("created_at", "id").only(
        "id", "owner_id", "name"
    ):
        by_owner.setdefault(machine.owner_id, []).append(machine)
    for machines in by_owner.values():
        taken = {m.name.lower() for m in machines}
        seen: set[str] = set()
        for machine in machines:
            key = machine.name.lower()
            if key not in seen:
                seen.add(key)
                continue
            new = _free_name(machine.name, taken)
            taken.add(new.lower())
            seen.add(new.lower())
            Machine.objects.filter(id=machine.id).update(name=new)


class Migration(migrations.Migration):
    dependencies = [
        ("hosts", "0008_device_retired_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="machine",
            name="retired_at",
            field=models.DateTimeField(
                blank=True,
                help_text="retired by its owner: kept in the records, never connects again",
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="machine",
            name="region",
            field=models.CharField(
                blank=True,
                db_index=True,
                max_length=32,
                validators=[hosts.regions.region_validate],
            ),
        ),
        migrations.RunPython(names_deduplicate, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="machine",
            constraint=models.UniqueConstraint(
                django.db.models.functions.text.Lower("name"),
                models.F("owner"),
                condition=models.Q(("retired_at__isnull", True)),
                name="machine_unique_name_per_owner",
                violation_error_message="You already have a machine of this name.",
            ),
        ),
    ]
