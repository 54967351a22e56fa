"""What the agent reports of its devices (``agent.telemetry``): a machine
without a usable GPU reports its CPU as a CPU, with its memory as memory
(docs/protocol-notes.md 2026-12-07)."""

from __future__ import annotations

import psutil
import pytest

from agent.telemetry import MIB, Telemetry, _cpu_device, _cpu_name

pytestmark = []


def test_the_cpu_is_reported_as_kind_cpu_with_its_system_memory():
    device = _cpu_device()
    assert device.index == 0 and device.kind == "cpu"
    assert device.name == _cpu_name() and device.name
    total = psutil.virtual_memory().total // MIB
    assert device.vram_total_mb == total


def test_without_nvml_the_machine_reports_its_cpu():
    telemetry = Telemetry()
    if telemetry.kind != "cpu":
        pytest.skip("this machine has an NVIDIA GPU read through NVML")
    [device] = telemetry.devices()
    assert device.kind == "cpu"
    [status] = telemetry.statuses()
    assert 0 < status.vram_free_mb <= device.vram_total_mb


def test_name_and_kind_can_be_overridden_for_demos():
    [device] = [
        d
        for d in Telemetry(
            name_override="NVIDIA GeForce RTX 4090", kind_override="gpu"
        ).devices()
        if d.index == 0
    ]
    assert (device.name, device.kind) == ("NVIDIA GeForce RTX 4090", "gpu")
    with pytest.raises(ValueError, match="kind_override"):
        Telemetry(kind_override="tpu")
