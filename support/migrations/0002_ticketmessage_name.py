"""A ticket's message is called a message in the admin (issue 35)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("support", "0001_initial")]

    operations = [
        migrations.AlterModelOptions(
            name="ticketmessage", options={"verbose_name": "message"}
        ),
    ]
