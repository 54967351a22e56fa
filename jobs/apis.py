"""Renter API reads (DRF): ``/v1/models``, ``/v1/jobs/{id}``, ``/v1/usage``."""

from __future__ import annotations

import uuid

from django.db.models import Q, Sum
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.models import LedgerTransaction
from billing.money import nano_to_usd_str
from billing.services import renter_balance_nano
from catalog.models import CatalogModel

from . import schema
from .errors import ApiError
from .models import Attempt, Job, Rental
from .rentals import MAX_HOURS, rental_create, rental_end
from .selectors import devices_rentable
from .modelfacts import WINDOW, model_facts

_NOT_OWN = "no such id (not a UUID, unknown, or another renter's)"


def _uuid_path(name: str) -> OpenApiParameter:
    """A path parameter holding a UUID (any other string is answered 404)."""
    return OpenApiParameter(name, OpenApiTypes.UUID, OpenApiParameter.PATH)


def _ts(value) -> int | None:
    return int(value.timestamp()) if value else None


class AttemptSerializer(serializers.ModelSerializer):
    """One attempt as a renter sees it: device label, kind, outcome, timings."""

    device = serializers.CharField(source="device.label")
    ttft_ms = serializers.IntegerField(allow_null=True)
    offered = serializers.SerializerMethodField()
    ended = serializers.SerializerMethodField()

    class Meta:
        model = Attempt
        fields = [
            "device",
            "kind",
            "outcome",
            "ttft_ms",
            "output_chars",
            "tokens_billed",
            "offered",
            "ended",
        ]

    def get_offered(self, obj: Attempt) -> int | None:
        return _ts(obj.offered_at)

    def get_ended(self, obj: Attempt) -> int | None:
        return _ts(obj.ended_at)


class JobSerializer(serializers.ModelSerializer):
    """A job object of PROTOCOL.md §1."""

    model = serializers.CharField(source="model_id")
    attempts = AttemptSerializer(many=True)
    cost = serializers.SerializerMethodField()
    created = serializers.SerializerMethodField()
    finished = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
            "id",
            "model",
            "status",
            "failed_over",
            "attempts",
            "tokens_billed",
            "cost",
            "created",
            "finished",
        ]

    def get_cost(self, obj: Job) -> str:
        return nano_to_usd_str(obj.cost_nano)

    def get_created(self, obj: Job) -> int | None:
        return _ts(obj.created_at)

    def get_finished(self, obj: Job) -> int | None:
        return _ts(obj.finished_at)


def _model_object(model: CatalogModel, now) -> dict:
    """A catalog model as ``/v1/models`` shows it, with live capacity, prices
    per million tokens and the fleet's measured speed (``modelfacts``, the
    models page's facts; docs/protocol-notes.md 2026-12-07)."""
    facts = model_facts(model=model, now=now)
    return {
        "id": model.id,
        "object": "model",
        "created": 0,
        "owned_by": "ballast",
        "family": model.family,
        "context_length": model.context_length,
        "pricing": {
            "prompt": nano_to_usd_str(model.price_prompt_nano),
            "completion": nano_to_usd_str(model.price_completion_nano),
        },
        "capacity": {
            "devices_online": facts.devices_online,
            "slots_free": facts.slots_free,
        },
        "pricing_per_million": {
            "prompt": nano_to_usd_str(facts.prompt_per_million_nano),
            "completion": nano_to_usd_str(facts.completion_per_million_nano),
        },
        "performance": {
            "ttft_ms": facts.ttft_ms,
            "tokens_per_s": (
                float(facts.tokens_per_s) if facts.tokens_per_s is not None else None
            ),
            "window_s": int(WINDOW.total_seconds()),
        },
    }


class ModelsApi(APIView):
    """``GET /v1/models``: catalog models with pricing and live capacity."""

    @extend_schema(responses={200: schema.MODEL_LIST, **schema.errors()})
    def get(self, request: Request) -> Response:
        now = timezone.now()
        return Response(
            {
                "object": "list",
                "data": [
                    _model_object(m, now)
                    for m in CatalogModel.objects.filter(active=True)
                ],
            }
        )


class ModelApi(APIView):
    """``GET /v1/models/{id}``: one catalog model (the ``openai`` client's retrieve)."""

    @extend_schema(
        responses={200: schema.MODEL, **schema.errors(404, s404="no such model")},
        operation_id="v1_model_retrieve",
    )
    def get(self, request: Request, model_id: str) -> Response:
        model = CatalogModel.objects.filter(id=model_id, active=True).first()
        if model is None:
            raise ApiError(
                404, f"model '{model_id}' is not in the catalog", "model_not_found"
            )
        return Response(_model_object(model, timezone.now()))


def renters_own(queryset, request: Request, object_id: str, what: str):
    """The object of ``queryset`` with id ``object_id`` that belongs to the
    request's renter. Raises ApiError 404 ("no such job: …") for an id that
    is not a UUID, unknown, or another renter's: the three look alike."""
    missing = ApiError(404, f"no such {what}: {object_id}"[:300], "not_found", "id")
    try:
        uuid.UUID(object_id)
    except ValueError:
        raise missing from None
    found = queryset.filter(id=object_id, renter=request.user).first()
    if found is None:
        raise missing
    return found


class JobApi(APIView):
    """``GET /v1/jobs/{id}``: the renter's own job; another's is 404."""

    @extend_schema(
        parameters=[_uuid_path("job_id")],
        responses={200: JobSerializer, **schema.errors(404, s404=_NOT_OWN)},
    )
    def get(self, request: Request, job_id) -> Response:
        job = renters_own(
            Job.objects.prefetch_related("attempts__device__machine"),
            request,
            job_id,
            "job",
        )
        return Response(JobSerializer(job).data)


class UsageApi(APIView):
    """``GET /v1/usage``: balance and recent charges (USD decimal strings)."""

    @extend_schema(responses={200: schema.USAGE, **schema.errors()})
    def get(self, request: Request) -> Response:
        charges = (
            LedgerTransaction.objects.filter(
                kind=LedgerTransaction.Kind.CHARGE, job__renter=request.user
            )
            .select_related("job")
            .annotate(
                amount=Sum(
                    "entries__amount_nano",
                    filter=Q(entries__account__kind="renter_credit"),
                )
            )
            # newest first: a grouped query leaves out the model's own ordering
            .order_by("-created_at", "-id")[:50]
        )
        recent = [
            {
                "job": str(t.job_id),
                "model": t.job.model_id,
                "tokens": t.job.tokens_billed,
                "cost": nano_to_usd_str(-(t.amount or 0)),
                "created": _ts(t.created_at),
            }
            for t in charges
        ]
        return Response(
            {
                "balance": nano_to_usd_str(renter_balance_nano(user=request.user)),
                "recent": recent,
            }
        )


class RentalSerializer(serializers.ModelSerializer):
    """A rental as its renter sees it (times as unix seconds, price in USD)."""

    device = serializers.SerializerMethodField()
    price_per_hour = serializers.SerializerMethodField()
    starts = serializers.SerializerMethodField()
    ends = serializers.SerializerMethodField()

    class Meta:

        model = Rental
        fields = [
            "id",
            "device",
            "hours",
            "status",
            "price_per_hour",
            "starts",
            "ends",
            "stop_reason",
        ]

    def get_device(self, obj) -> dict:
        return {"id": obj.device_id, "label": obj.device.label, "name": obj.device.name}

    def get_price_per_hour(self, obj) -> str:
        return nano_to_usd_str(obj.price_per_hour_nano)

    def get_starts(self, obj) -> int | None:
        return _ts(obj.starts_at)

    def get_ends(self, obj) -> int | None:
        return _ts(obj.ends_at)


class DevicesApi(APIView):
    """``GET /v1/devices``: live devices a renter may rent (not rented, not
    quarantined, not the renter's own)."""

    @extend_schema(responses={200: schema.DEVICE_LIST, **schema.errors()})
    def get(self, request: Request) -> Response:

        devices = devices_rentable(
            now=timezone.now(), renter=request.user
        ).prefetch_related("models")
        return Response(
            {
                "data": [
                    {
                        "id": d.id,
                        "label": d.label,
                        "name": d.name,
                        "kind": d.kind,
                        "vram_total_mb": d.vram_total_mb,
                        "region": d.machine.region,
                        "score": d.score,
                        "models": sorted(
                            m.model_id for m in d.models.all() if m.loaded
                        ),
                        "measured": _measured(d),
                    }
                    for d in devices
                ]
            }
        )


def _measured(device) -> dict:
    """What Ballast measured of ``device`` per model (its ``models``
    prefetched): ``{model id: {"tokens_per_s" (null while fewer than 3 jobs),
    "jobs", "like" (``catalog.gpus.measured_like``), "placed_as" (the GPU class
    ``placement.gpu``/``min_vram_gb`` may place it as, or null)}}``; docs/
    design-notes.md "Placement by what was measured"."""
    measured = {}
    for row in device.models.all():
        if not row.measured_jobs:
            continue
        verdict = row.placement_verdict()
        measured[row.model_id] = {
            "tokens_per_s": row.measured_tokens_per_s,
            "jobs": row.measured_jobs,
            "like": row.measured_like,
            "placed_as": verdict.gpu_class.name if verdict.placed else None,
        }
    return measured


class RentalsApi(APIView):
    """``GET /v1/rentals`` (the renter's) and ``POST /v1/rentals`` {device, hours}."""

    @extend_schema(
        responses={200: schema.rental_list(RentalSerializer), **schema.errors()}
    )
    def get(self, request: Request) -> Response:

        rentals = Rental.objects.filter(renter=request.user).select_related(
            "device__machine"
        )[:100]
        return Response({"data": RentalSerializer(rentals, many=True).data})

    @extend_schema(
        request=schema.rental_request(MAX_HOURS),
        parameters=[schema.RETRY_AFTER],
        responses={
            201: RentalSerializer,
            **schema.errors(
                400,
                402,
                404,
                409,
                415,
                s402="the balance cannot cover the rental's whole period",
                s404="no such live device",
                s409="the device is already rented or not available for rent",
            ),
        },
    )
    def post(self, request: Request) -> Response:

        device = request.data.get("device") if isinstance(request.data, dict) else None
        if isinstance(device, bool) or not isinstance(device, int):
            raise ApiError(
                400,
                "'device' must be a device id from /v1/devices",
                "invalid_request",
                "device",
            )
        rental = rental_create(
            renter=request.user, device_id=device, hours=request.data.get("hours")
        )
        return Response(RentalSerializer(rental).data, status=201)


class RentalApi(APIView):
    """``GET /v1/rentals/{id}``; ``DELETE`` ends it early (billed up to now)."""

    def _rental(self, request: Request, rental_id):

        return renters_own(
            Rental.objects.select_related("device__machine"),
            request,
            rental_id,
            "rental",
        )

    @extend_schema(
        parameters=[_uuid_path("rental_id")],
        responses={200: RentalSerializer, **schema.errors(404, s404=_NOT_OWN)},
        operation_id="v1_rental_retrieve",
    )
    def get(self, request: Request, rental_id) -> Response:
        return Response(RentalSerializer(self._rental(request, rental_id)).data)

    @extend_schema(
        parameters=[_uuid_path("rental_id")],
        responses={200: RentalSerializer, **schema.errors(404, s404=_NOT_OWN)},
    )
    def delete(self, request: Request, rental_id) -> Response:

        rental = rental_end(rental=self._rental(request, rental_id))
        return Response(RentalSerializer(rental).data)
