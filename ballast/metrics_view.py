"""``GET /metrics``: Ballast's metrics for Prometheus (docs/metrics.md).

Reached by staff only: a staff user's session, or a scraper sending ``Authorization:
Bearer <BALLAST_METRICS_TOKEN>`` (when that setting is set). Anyone else gets 404,
as if there were nothing here.

The counters and histograms of ``ballast.metrics`` come from this process, or, in
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``), from every process sharing that
folder; the gauges are read from the database at the scrape (``StateCollector``),
so they hold for the whole platform whichever process answers.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from catalog.models import CatalogModel
from jobs.selectors import model_capacity


class StateCollector:
    """Gauges read from the database at each scrape: per catalog model, the
    devices online with it loaded and their free slots (``model_capacity``)."""

    def collect(self) -> Iterator[Metric]:
        online = GaugeMetricFamily(
            "ballast_devices_online",
            "Live devices with the model loaded",
            labels=["model"],
        )
        free = GaugeMetricFamily(
            "ballast_slots_free",
            "Free slots of the live devices that can take serverless work now",
            labels=["model"],
        )
        now = timezone.now()
        for model_id in CatalogModel.objects.order_by("id").values_list(
            "id", flat=True
        ):
            capacity = model_capacity(model_id=model_id, now=now)
            online.add_metric([model_id], capacity["devices_online"])
            free.add_metric([model_id], capacity["slots_free"])
        yield online
        yield free


class _ThisProcess:
    """The default registry's metrics (this process alone: no multiprocess mode)."""

    def collect(self) -> Iterator[Metric]:
        return REGISTRY.collect()


def scrape_registry() -> CollectorRegistry:
    """A registry of everything one scrape shows."""
    registry = CollectorRegistry(auto_describe=False)
    if settings.PROMETHEUS_MULTIPROC_DIR:
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_ThisProcess())
    registry.register(StateCollector())
    return registry


def scrape_allowed(request: HttpRequest) -> bool:
    """Whether ``request`` may read the metrics: a staff session, or the bearer
    token ``BALLAST_METRICS_TOKEN`` (compared in constant time)."""
    if request.user.is_authenticated and request.user.is_staff:
        return True
    token = settings.BALLAST_METRICS_TOKEN
    sent = request.headers.get("Authorization", "")
    return bool(token) and hmac.compare_digest(
        sent.encode(), f"Bearer {token}".encode()
    )


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The metrics in Prometheus' text format; 404 for anyone but staff."""
    if not scrape_allowed(request):
        raise Http404
    return HttpResponse(
        generate_latest(scrape_registry()), content_type=CONTENT_TYPE_LATEST
    )
