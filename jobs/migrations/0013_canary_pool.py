"""The spot-check pool drawn from a secret (jobs.canarygen): every canary stored
before it was one of the prompts this public repository shipped, so it is
retired (kept for the checks that name it, never sent again)."""

import django.utils.timezone
from django.db import migrations, models


def retire_shipped(apps, schema_editor):
    apps.get_model("jobs", "CanaryPrompt").objects.update(status="retired")


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0012_apikey_spend_cap'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='canaryprompt',
            name='canary_unique_prompt',
        ),
        migrations.RemoveField(
            model_name='canaryprompt',
            name='calibrated',
        ),
        migrations.AddField(
            model_name='canaryprompt',
            name='created_at',
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.AddField(
            model_name='canaryprompt',
            name='distractors',
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name='canaryprompt',
            name='endpoint',
            field=models.CharField(default='chat', max_length=16),
        ),
        migrations.AddField(
            model_name='canaryprompt',
            name='family',
            field=models.CharField(blank=True, max_length=16),
        ),
        migrations.AddField(
            model_name='canaryprompt',
            name='first_sent_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='canaryprompt',
            name='index',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='canaryprompt',
            name='messages',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='canaryprompt',
            name='params',
            field=models.JSONField(default=dict),
        ),
        migrations.AddField(
            model_name='canaryprompt',
            name='sent_count',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='canaryprompt',
            name='status',
            field=models.CharField(choices=[('drawn', 'Drawn'), ('calibrated', 'Calibrated'), ('rejected', 'Rejected'), ('retired', 'Retired')], default='drawn', max_length=12),
        ),
        migrations.AddField(
            model_name='canaryprompt',
            name='stream',
            field=models.BooleanField(default=False),
        ),
        migrations.AlterField(
            model_name='canaryprompt',
            name='model_id',
            field=models.CharField(max_length=100),
        ),
        migrations.AlterField(
            model_name='canaryprompt',
            name='prompt',
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='canaryprompt',
            index=models.Index(fields=['model_id', 'status', 'sent_count'], name='canary_pick'),
        ),
        migrations.AddConstraint(
            model_name='canaryprompt',
            constraint=models.UniqueConstraint(fields=('model_id', 'index'), name='canary_unique_draw'),
        ),
        migrations.RunPython(retire_shipped, migrations.RunPython.noop),
    ]
