"""The renter API's OpenAPI description (drf-spectacular, ``GET /api/schema/``).

The views are ``APIView``s answering dicts, so their response shapes are named
here (``extend_schema`` in ``jobs.apis``), and the API-key authentication is
described as a bearer scheme. Imported by ``JobsConfig.ready``.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import inline_serializer
from rest_framework import serializers


class ApiKeyScheme(OpenApiAuthenticationExtension):
    """``Authorization: Bearer <API key>`` (``jobs.auth.ApiKeyAuthentication``)."""

    target_class = "jobs.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema) -> dict:
        return {"type": "http", "scheme": "bearer", "description": "a renter API key"}


_usd = serializers.CharField(help_text="USD, a decimal string")


MODEL = inline_serializer(
    "Model",
    {
        "id": serializers.CharField(),
        "object": serializers.CharField(default="model"),
        "created": serializers.IntegerField(),
        "owned_by": serializers.CharField(),
        "family": serializers.CharField(),
        "context_length": serializers.IntegerField(help_text="tokens"),
        "pricing": inline_serializer(
            "ModelPricing", {"prompt": _usd, "completion": _usd}
        ),
        "capacity": inline_serializer(
            "ModelCapacity",
            {
                "devices_online": serializers.IntegerField(),
                "slots_free": serializers.IntegerField(),
            },
        ),
    },
)
MODEL_LIST = inline_serializer(
    "ModelList",
    {
        "object": serializers.CharField(default="list"),
        "data": MODEL.__class__(many=True),  # the same component as MODEL
    },
)

USAGE = inline_serializer(
    "Usage",
    {
        "balance": _usd,
        "recent": inline_serializer(
            "Charge",
            {
                "job": serializers.UUIDField(),
                "model": serializers.CharField(),
                "tokens": serializers.IntegerField(),
                "cost": _usd,
                "created": serializers.IntegerField(help_text="unix s"),
            },
            many=True,
        ),
    },
)

DEVICE_LIST = inline_serializer(
    "DeviceList",
    {
        "data": inline_serializer(
            "RentableDevice",
            {
                "id": serializers.IntegerField(),
                "label": serializers.CharField(),
                "name": serializers.CharField(),
                "vram_total_mb": serializers.IntegerField(help_text="MiB"),
                "region": serializers.CharField(),
                "score": serializers.IntegerField(help_text="0-100"),
                "models": serializers.ListField(child=serializers.CharField()),
            },
            many=True,
        )
    },
)

RENTAL_REQUEST = inline_serializer(
    "RentalRequest",
    {
        "device": serializers.IntegerField(help_text="an id from /v1/devices"),
        "hours": serializers.IntegerField(),
    },
)


def rental_list(rental_serializer) -> serializers.Serializer:
    """``GET /v1/rentals``: ``{"data": [rental, ...]}``."""
    return inline_serializer("RentalList", {"data": rental_serializer(many=True)})
