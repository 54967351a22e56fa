"""A deactivated user stops at once (DESIGN.md "Limits and abuse"): the renter
websockets of their keys and their machines' connections are closed, on every
coordinator process (through the channel layer), once the change commits. New
requests and connections are refused by the checks themselves
(``jobs.services.api_key_authenticate``, ``hosts.services.machine_authenticate``).

A user is deactivated by saving it (``is_active = False``: the admin, a
service); a queryset ``update()`` sends no signal.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db.models.signals import post_save
from django.dispatch import receiver

from hosts.services import machines_of_owner_close
from jobs.models import ApiKey
from jobs.services import api_keys_connections_close


@receiver(post_save, sender=get_user_model())
def user_deactivated_close(sender, instance, created: bool, **kwargs) -> None:
    """Close the open connections of a user saved inactive (see the module)."""
    if created or instance.is_active:
        return
    api_keys_connections_close(
        key_ids=ApiKey.objects.filter(user_id=instance.pk).values_list("id", flat=True)
    )
    machines_of_owner_close(owner_id=instance.pk)
