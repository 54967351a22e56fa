"""Renter authentication by API key (``Authorization: Bearer <key>``)."""

from __future__ import annotations

from django.utils import timezone
from rest_framework import authentication, exceptions

from .models import ApiKey, CatalogModel
from .services import api_key_and_model


def bearer_from_header(value: str) -> str:
    """The token of an ``Authorization: Bearer …`` header value, or ''."""
    value = (value or "").strip()
    return value[7:].strip() if value[:7].lower() == "bearer " else ""


def api_key_from_request_header(header: str) -> ApiKey | None:
    """The live API key named by an Authorization header value, or None; marks it used."""
    return api_key_and_model_from_request_header(header)[0]


def api_key_and_model_from_request_header(
    header: str, model_id: str | None = None
) -> tuple[ApiKey | None, CatalogModel | None]:
    """``api_key_from_request_header`` and the active catalog model ``model_id``,
    read in the same statement (``services.api_key_and_model``)."""
    key, model = api_key_and_model(plain=bearer_from_header(header), model_id=model_id)
    if key is not None:
        api_key_mark_used(key)
    return key, model


def api_key_mark_used(key: ApiKey) -> None:
    """Write the key's ``last_used_at`` when it is stale (at most once a minute,
    ``services.API_KEY_LAST_USED_EVERY``)."""
    if key.last_used_stale:
        ApiKey.objects.filter(id=key.id).update(last_used_at=timezone.now())


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """DRF authentication: a live API key makes its owner the request's user."""

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        key = api_key_from_request_header(header)
        if key is None:
            raise exceptions.AuthenticationFailed("invalid or revoked API key")
        return key.user, key

    def authenticate_header(self, request) -> str:
        return "Bearer"
