"""Renter authentication by API key (``Authorization: Bearer <key>``)."""

from __future__ import annotations

from rest_framework import authentication, exceptions

from .models import ApiKey
from .services import api_key_authenticate, api_key_mark_used


def bearer_from_header(value: str) -> str:
    """The token of an ``Authorization: Bearer …`` header value, or ''."""
    value = (value or "").strip()
    return value[7:].strip() if value[:7].lower() == "bearer " else ""


def api_key_from_request_header(header: str) -> ApiKey | None:
    """The live API key named by an Authorization header value, or None; marks
    it used (``services.api_key_mark_used``)."""
    key = api_key_authenticate(plain=bearer_from_header(header))
    if key is not None:
        api_key_mark_used(key=key)
    return key


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
