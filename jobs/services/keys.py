"""API keys: made, checked on every request, marked used (DESIGN.md "Limits and
abuse": a key is checked on every request, whatever the transport)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import DEFAULT_DB_ALIAS, connection, transaction
from django.utils import timezone

from ballast.db import commit_unflushed_sql
from ballast.rows import columns, instances
from catalog.models import CatalogModel
from catalog.selectors import CATALOG_MODEL, CATALOG_MODEL_ACTIVE
from hosts.models import token_hash, token_new

from ..models import ApiKey

log = logging.getLogger("ballast.jobs")

# a key's ``last_used_at`` is written at most this often
API_KEY_LAST_USED_EVERY = timedelta(minutes=1)


def api_key_create(
    *, user: AbstractBaseUser, name: str = "default"
) -> tuple[ApiKey, str]:
    """Create an API key for ``user``; return it and the plain key (shown once)."""
    plain = token_new("bk")
    key = ApiKey.objects.create(
        user=user,
        name=name[:100] or "default",
        prefix=plain[:10],
        key_hash=token_hash(plain),
    )
    return key, plain


# a live key by its hash: not revoked, its renter active (one fixed statement:
# every request runs it; ``{unflushed}``: ``commit_unflushed_sql``'s or nothing;
# ``{model}``: the request's model, joined, or nothing)
_KEY = (ApiKey, "k")
_LIVE_KEY_SQL = (
    "SELECT {columns} FROM jobs_apikey k"
    " JOIN auth_user u ON u.id = k.user_id{unflushed}{model}"
    " WHERE k.key_hash = %s AND k.revoked_at IS NULL AND u.is_active"
)
_MODEL_JOIN = f" LEFT JOIN jobs_catalogmodel c ON {CATALOG_MODEL_ACTIVE}"


def api_key_authenticate(*, plain: str, unflushed: bool = False) -> ApiKey | None:
    """The live key of a plain API key (not revoked, its renter active), its
    row with ``user`` (its id; other fields read on access); None for anything else
    (empty, unknown, revoked, an inactive renter). With ``unflushed`` the
    caller's transaction, which must store no money, commits unflushed
    (``ballast.db.commit_unflushed_sql``, in the same statement)."""
    return api_key_with_model(plain=plain, unflushed=unflushed)[0]


def api_key_with_model(
    *, plain: str, model_id: str | None = None, unflushed: bool = False
) -> tuple[ApiKey | None, CatalogModel | None]:
    """``api_key_authenticate``'s key and, read by the same statement, the
    active catalog model ``model_id`` (``catalog.selectors.
    CATALOG_MODEL_ACTIVE``): (None, None) without a live key; (key, None)
    when the model is unknown or inactive, or ``model_id`` is None. One
    round trip for a request's first two reads (issue 34)."""
    if not plain:
        return None, None
    parts, params = (_KEY,), [token_hash(plain)]
    if model_id:  # the join's parameter comes before the key's in the SQL
        parts, params = (_KEY, CATALOG_MODEL), [model_id, *params]
    sql = _LIVE_KEY_SQL.format(
        columns=columns(*parts),
        unflushed=commit_unflushed_sql() if unflushed else "",
        model=_MODEL_JOIN if model_id else "",
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None, None
    found = instances(row, *parts)
    key, model = found[0], (found[1] if model_id else None)
    key.user = get_user_model().from_db(
        DEFAULT_DB_ALIAS, ["id", "is_active"], [key.user_id, True]
    )
    return key, model


def api_key_mark_used(*, key: ApiKey, now=None) -> None:
    """Write the key's ``last_used_at`` when it is older than
    ``API_KEY_LAST_USED_EVERY`` (or unset): at most one write a minute a key."""
    now = now or timezone.now()
    if key.last_used_at is None or key.last_used_at < now - API_KEY_LAST_USED_EVERY:
        ApiKey.objects.filter(id=key.id).update(last_used_at=now)
        key.last_used_at = now


def api_key_group(key_id: int) -> str:
    """The channel-layer group of the renter websockets open with key ``key_id``."""
    return f"apikey.{key_id}"


def api_keys_connections_close(*, key_ids: Iterable[int]) -> None:
    """Once the caller's transaction commits, close every renter websocket open
    with one of these keys, on every coordinator process (a ``key.revoked``
    message to each key's group, through the channel layer): a revoked key or a
    deactivated renter stops at once, not only at its next request. Outside a
    transaction it is sent at once. A layer that cannot be reached is logged
    (the key is refused at the next request anyway)."""
    ids = list(key_ids)
    if not ids:
        return

    def send() -> None:
        layer = get_channel_layer()
        for key_id in ids:
            try:
                async_to_sync(layer.group_send)(
                    api_key_group(key_id), {"type": "key.revoked"}
                )
            except Exception:
                log.exception("closing the websockets of API key %s failed", key_id)

    transaction.on_commit(send)
