"""Load the catalog's reference model, SmolLM2-135M-Instruct (PROTOCOL.md §1)."""

from django.db import migrations

REFERENCE = {
    "id": "smollm2-135m-instruct",
    "family": "smollm2",
    "context_length": 8192,
    "vram_per_request_mb": 256,  # an estimate: Q4_1 weights (~95 MiB) + KV cache
    "price_prompt_nano": 0,
    "price_completion_nano": 200,  # 0.0000002 USD per output token
}


def load(apps, schema_editor):
    CatalogModel = apps.get_model("jobs", "CatalogModel")
    CatalogModel.objects.update_or_create(id=REFERENCE["id"], defaults=REFERENCE)


def unload(apps, schema_editor):
    apps.get_model("jobs", "CatalogModel").objects.filter(id=REFERENCE["id"]).delete()


class Migration(migrations.Migration):
    dependencies = [("jobs", "0001_initial")]
    operations = [migrations.RunPython(load, unload)]
