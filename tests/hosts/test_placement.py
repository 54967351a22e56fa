"""What the coordinator measures of a device, and what that allows placement
(``hosts.services.device_speed_record``, ``device_placement_judge``); a
device's declared kind (docs/protocol-notes.md 2026-12-07)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from catalog.gpus import MEASURED_KEPT, MEASURED_MIN_TOKENS
from hosts.models import Device, DeviceModel, Measurement
from hosts.protocol import FrameError, parse_hello
from hosts.services import device_speed_record
from tests.devices import MODEL, device_measured, device_online

pytestmark = pytest.mark.django_db


def row(device) -> DeviceModel:
    return DeviceModel.objects.get(device=device, model_id=MODEL)


def test_it_measures_only_answers_long_enough(live_device):
    device = live_device()
    short = device_speed_record(
        device_id=device.id,
        model_id=MODEL,
        tokens=MEASURED_MIN_TOKENS - 1,
        seconds=0.01,
        now=timezone.now(),
    )
    assert short is None and not Measurement.objects.exists()
    assert row(device).measured_jobs == 0


def test_it_keeps_the_latest_measurements_and_judges_their_median(live_device):
    device = live_device()
    assert device_measured(device, tokens_per_s=400, jobs=2) is None
    assert row(device).placed_name == "" and row(device).measured_jobs == 2
    assert device_measured(device, tokens_per_s=100, jobs=1) == pytest.approx(400)
    placed = row(device)
    assert placed.placed_name == "NVIDIA GeForce RTX 4090"
    assert placed.placed_vram_mb == 24576
    device_measured(device, tokens_per_s=100, jobs=MEASURED_KEPT)
    assert Measurement.objects.filter(device=device).count() == MEASURED_KEPT
    assert row(device).measured_tokens_per_s == pytest.approx(100)
    assert row(device).placed_name == "", "a 4090 is faster than that"
    assert row(device).measured_jobs == 3 + MEASURED_KEPT


def test_a_device_declaring_another_name_is_judged_again_at_its_hello(live_device):
    """Measured at 220 tokens/s: a high-end GPU's speed, not a top-end one's.
    Declared an RTX 4090 it is not placed; declared an RTX 3090 it is; declared
    a CPU it is not."""
    device = live_device()
    device_measured(device, tokens_per_s=220)
    assert row(device).placed_name == ""
    device_online(device.machine, gpu="NVIDIA GeForce RTX 3090")
    assert row(device).placed_name == "NVIDIA GeForce RTX 3090"
    device_online(device.machine, gpu="NVIDIA GeForce RTX 3090", kind="cpu")
    assert row(device).placed_name == ""
    assert Device.objects.get(id=device.id).kind == "cpu"


def hello(**device) -> dict:
    return {
        "agent_version": "1",
        "engine": {"name": "llamacpp"},
        "public_key": "A" * 43 + "=",
        "devices": [{"index": 0, "name": "x", "vram_total_mb": 1, **device}],
    }


def test_a_hello_declares_a_device_kind_gpu_by_default():
    assert parse_hello(hello())["devices"][0]["kind"] == "gpu"
    assert parse_hello(hello(kind="cpu"))["devices"][0]["kind"] == "cpu"
    for bad in ("tpu", "", 1, None):
        with pytest.raises(FrameError, match=r"devices\[0\]\.kind"):
            parse_hello(hello(kind=bad))
