"""The catalog model leaves the jobs app: state only, its table stays jobs_catalogmodel.

The table was created by jobs 0001 and filled by jobs 0002 and 0005 (the reference
model); this migration only tells Django's state that ``catalog.CatalogModel`` owns
it, and moves the model's content type (so staff permissions and admin log entries
follow it). jobs 0010 then drops ``jobs.CatalogModel`` from the state.
"""

from django.db import migrations, models


def content_type_move(apps, schema_editor, source="jobs", target="catalog"):
    ContentType = apps.get_model("contenttypes", "ContentType")
    db = schema_editor.connection.alias
    types = ContentType.objects.using(db).filter(model="catalogmodel")
    if not types.filter(app_label=target).exists():
        types.filter(app_label=source).update(app_label=target)


def content_type_move_back(apps, schema_editor):
    content_type_move(apps, schema_editor, source="catalog", target="jobs")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("jobs", "0005_reference_model_context"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="CatalogModel",
                    fields=[
                        ("id", models.CharField(max_length=100, primary_key=True, serialize=False)),
                        ("family", models.CharField(max_length=64)),
                        ("context_length", models.PositiveIntegerField()),
                        ("vram_per_request_mb", models.PositiveIntegerField()),
                        ("price_prompt_nano", models.BigIntegerField(default=0)),
                        ("price_completion_nano", models.BigIntegerField()),
                        ("active", models.BooleanField(default=True)),
                    ],
                    options={
                        "db_table": "jobs_catalogmodel",
                        "ordering": ["id"],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_type_move, content_type_move_back, elidable=True),
    ]
