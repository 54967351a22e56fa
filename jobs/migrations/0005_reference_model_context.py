"""The reference model's context is what the reference agent runs: 2,048 tokens.

The llama.cpp engine of the agent opens SmolLM2 with n_ctx=2048; advertising more
let renters send prompts every host must refuse.
"""

from django.db import migrations


def set_context(apps, schema_editor):
    apps.get_model("jobs", "CatalogModel").objects.filter(id="smollm2-135m-instruct").update(
        context_length=2048
    )


class Migration(migrations.Migration):
    dependencies = [("jobs", "0004_trust")]
    operations = [migrations.RunPython(set_context, migrations.RunPython.noop)]
