"""Writes of the renter pages (keys are created by ``jobs.services.api_key_create``)."""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from jobs.models import ApiKey
from jobs.services import api_keys_connections_close


def api_key_revoke(
    *, user: AbstractBaseUser, key_id: int, now: datetime | None = None
) -> bool:
    """Revoke one of the user's live keys (a compare-and-set); True when this call did.

    Another user's key, or one already revoked, is left alone (returns False).
    The key's open renter websockets are closed once this commits, on every
    coordinator process (``jobs.services.api_keys_connections_close``).
    """
    now = now or timezone.now()
    with transaction.atomic():
        revoked = bool(
            ApiKey.objects.filter(
                id=key_id, user_id=user.pk, revoked_at__isnull=True
            ).update(revoked_at=now)
        )
        if revoked:
            api_keys_connections_close(key_ids=[key_id])
    return revoked
