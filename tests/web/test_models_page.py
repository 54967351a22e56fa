"""The models page and ``GET /v1/models`` (issue 35 item 3): per model its
price per million tokens in and out, context length, devices online, and the
fleet's median time to first token and tokens per second, measured by the
coordinator (outcomes, ``hosts.Measurement``), the same facts in both."""

from __future__ import annotations

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from catalog.models import CatalogModel
from hosts.models import Measurement
from hosts.services import device_outcome_record

from .conftest import MODEL


def _measured(machine) -> None:
    """Three answers of the model: first tokens 900, 1105 and 1400 ms; speeds
    60, 69.1 and 80 tokens/s; and one of two days ago that counts for nothing."""
    device = machine.devices.get()
    for ttft in (900, 1105, 1400):
        device_outcome_record(
            device_id=device.id, success=True, model_id=MODEL, ttft_ms=ttft
        )
    now = timezone.now()
    for tokens, seconds, ago in ((60, 1, 0), (691, 10, 0), (80, 1, 0), (5, 1, 48)):
        Measurement.objects.create(
            device=device,
            model_id=MODEL,
            tokens=tokens,
            seconds=seconds,
            measured_at=now - timedelta(hours=ago),
        )


def test_the_models_page_reads_price_context_capacity_and_speed(client, machine):
    _measured(machine)
    CatalogModel.objects.filter(id=MODEL).update(
        price_prompt_nano=50, price_completion_nano=200, context_length=2048
    )
    html = client.get(reverse("models_page")).content.decode()  # public: no log-in
    row = html[html.index(f'id="model-{MODEL}"') :]
    row = row[: row.index("</tr>")]
    assert ">$0.05</span> <span" in row and ">$0.20</span>" in row
    assert "2,048 tokens" in row
    assert 'class="num online">1 <span class="muted small">2 slots free' in row
    assert "1,105 ms" in row and "69.1 tok/s" in row


def test_v1_models_carries_the_same_facts(client, machine, api_key):
    _measured(machine)
    CatalogModel.objects.filter(id=MODEL).update(
        price_prompt_nano=50, price_completion_nano=200
    )
    answer = client.get(
        "/v1/models", HTTP_AUTHORIZATION=f"Bearer {api_key}"
    ).json()
    (item,) = [m for m in answer["data"] if m["id"] == MODEL]
    assert item["pricing"] == {"prompt": "0.00000005", "completion": "0.0000002"}
    assert item["pricing_per_million"] == {"prompt": "0.05", "completion": "0.2"}
    assert item["capacity"] == {"devices_online": 1, "slots_free": 2}
    assert item["performance"] == {
        "ttft_ms": 1105,
        "tokens_per_s": 69.1,
        "window_s": 86400,
    }


def test_a_model_nobody_measured_says_so(client, catalog):
    html = client.get(reverse("models_page")).content.decode()
    row = html[html.index(f'id="model-{MODEL}"') :]
    row = row[: row.index("</tr>")]
    assert row.count("not measured yet") == 2 and 'class="num online">0<' in row
