"""The renter API's OpenAPI description (drf-spectacular, ``GET /api/schema/``).

The views are ``APIView``s answering dicts, so their response shapes are named
here (``extend_schema`` in ``jobs.apis``), with every error status they answer
(``errors``, OpenAI's error body) and the API-key authentication described as a
bearer scheme. The completions, plain async views, are described in
``jobs.schema.completions``. Imported by ``jobs.apis``.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, inline_serializer
from rest_framework import serializers

from ..errors import ERROR_TYPES


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
        "pricing_per_million": inline_serializer(
            "ModelPricingPerMillion",
            {"prompt": _usd, "completion": _usd},
            help_text="USD per million tokens (pricing × 1,000,000)",
        ),
        "performance": inline_serializer(
            "ModelPerformance",
            {
                "ttft_ms": serializers.IntegerField(
                    allow_null=True,
                    help_text="median time to first token of the fleet's"
                    " succeeded attempts (offer to first token), ms; null when"
                    " none in the window",
                ),
                "tokens_per_s": serializers.FloatField(
                    allow_null=True,
                    help_text="median output tokens per second, offer to"
                    " answer, measured by Ballast; null when none in the window",
                ),
                "window_s": serializers.IntegerField(
                    help_text="the medians' window, s"
                ),
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
                "name": serializers.CharField(help_text="as its host declared it"),
                "kind": serializers.ChoiceField(
                    choices=["gpu", "cpu"], help_text="as its host declared it"
                ),
                "vram_total_mb": serializers.IntegerField(
                    help_text="MiB, as its host declared it (a CPU's: its memory)"
                ),
                "region": serializers.CharField(),
                "score": serializers.IntegerField(help_text="0-100"),
                "models": serializers.ListField(child=serializers.CharField()),
                "measured": serializers.DictField(
                    child=inline_serializer(
                        "DeviceMeasured",
                        {
                            "tokens_per_s": serializers.FloatField(
                                allow_null=True,
                                help_text="median of its latest measured jobs"
                                " (offer to answer), null until 3",
                            ),
                            "jobs": serializers.IntegerField(),
                            "like": serializers.CharField(
                                help_text="the GPU class that speed is like"
                            ),
                            "placed_as": serializers.CharField(
                                allow_null=True,
                                help_text="the GPU class placement.gpu and"
                                " min_vram_gb may place it as (null: none)",
                            ),
                        },
                    ),
                    help_text="what Ballast measured of it, per model id",
                ),
            },
            many=True,
        )
    },
)


def rental_request(max_hours: int) -> serializers.Serializer:
    """``POST /v1/rentals``'s body; ``max_hours``: ``jobs.rentals.MAX_HOURS``."""
    return inline_serializer(
        "RentalRequest",
        {
            "device": serializers.IntegerField(help_text="an id from /v1/devices"),
            "hours": serializers.IntegerField(min_value=1, max_value=max_hours),
        },
    )


def rental_list(rental_serializer) -> serializers.Serializer:
    """``GET /v1/rentals``: ``{"data": [rental, ...]}``."""
    return inline_serializer("RentalList", {"data": rental_serializer(many=True)})


# --- errors --------------------------------------------------------------------------
ERROR_OBJECT = inline_serializer(
    "ErrorObject",
    {
        "message": serializers.CharField(),
        "type": serializers.ChoiceField(
            choices=sorted({*ERROR_TYPES.values(), "api_error"})
        ),
        "code": serializers.CharField(),
        "param": serializers.CharField(
            allow_null=True, help_text="the bad field of a 400 (`messages[0].role`)"
        ),
    },
)
ERROR = inline_serializer("Error", {"error": ERROR_OBJECT})

# what each error status means on the renter API (PROTOCOL.md §1, protocol notes)
ERROR_MEANINGS = {
    400: "bad request; `param` names the field",
    401: "missing, invalid or revoked API key",
    402: "the credit cannot cover it",
    404: "not found (or not yours)",
    409: "conflicts with the current state",
    413: "request body past 2.5 MB",
    415: "the body must be JSON (`application/json`)",
    429: "rate limited; retry after `Retry-After` s",
    502: "every attempt failed before any output (nothing billed)",
    503: "unavailable: no live device meets the request (the message names the "
    "requirement), or the database or message layer is down; retry after "
    "`Retry-After` s",
    504: "waited past the queue's wall clock",
}

RETRY_AFTER = OpenApiParameter(
    "Retry-After",
    OpenApiTypes.INT,
    OpenApiParameter.HEADER,
    response=[429, 503],
    description="seconds to wait before retrying",
)


def errors(*statuses: int, **meanings: str) -> dict[int, OpenApiResponse]:
    """``extend_schema`` responses for the error ``statuses`` of an operation, each
    OpenAI's error body; 401 and 503 (a database that cannot be reached) are
    every API's. ``meanings``: ``s404="no such job"`` replaces a status's
    description."""
    described = {**ERROR_MEANINGS, **{int(k[1:]): v for k, v in meanings.items()}}
    return {
        status: OpenApiResponse(ERROR, description=described[status])
        for status in sorted({401, 503, *statuses})
    }
