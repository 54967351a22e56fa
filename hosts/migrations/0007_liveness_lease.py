# Liveness outside the machine rows: per-process leases (issue 8, heartbeats).

import uuid

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('hosts', '0006_devicemodel_ranking'),
    ]

    operations = [
        migrations.CreateModel(
            name='CoordinatorLease',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('name', models.CharField(blank=True, max_length=200)),
                ('started_at', models.DateTimeField(auto_now_add=True)),
                ('lease_until', models.DateTimeField()),
            ],
        ),
        migrations.AddField(
            model_name='machine',
            name='lease',
            field=models.ForeignKey(blank=True, help_text='the coordinator process whose lease vouches for this connection', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='machines', to='hosts.coordinatorlease'),
        ),
        migrations.AddField(
            model_name='machine',
            name='stale',
            field=models.BooleanField(db_default=True, default=True, help_text='no heartbeat recent enough for the lease to vouch for (or none yet)'),
        ),
        migrations.AlterField(
            model_name='machine',
            name='last_heartbeat_at',
            field=models.DateTimeField(blank=True, help_text='a heartbeat at least this recent was received (written on changes)', null=True),
        ),
    ]
