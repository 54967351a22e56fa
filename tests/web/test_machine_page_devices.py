"""The machine page lists a device as what it is and what Ballast measured:
a CPU as ``cpu0`` with its memory as memory, a declared GPU with the class its
measured speed is like and whether placement may use it (docs/design-notes.md
"Placement by what was measured")."""

from __future__ import annotations

import html as htmllib

from django.urls import reverse

from hosts.services import machine_register
from tests.devices import device_measured, device_online


def page(client, machine) -> str:
    response = client.get(reverse("hosts:machine", args=[machine.id]))
    assert response.status_code == 200
    return htmllib.unescape(response.content.decode())


def test_a_cpu_is_listed_as_a_cpu_with_its_memory(owner_client, owner, catalog):
    machine, _ = machine_register(owner=owner, name="box", region="eu")
    device_online(
        machine,
        gpu="AMD EPYC 7763 64-Core Processor",
        kind="cpu",
        vram_total_mb=24576,
        temp_c=None,
    )
    text = page(owner_client, machine)
    assert "cpu0 · AMD EPYC 7763 64-Core Processor · 24 GB memory" in text
    assert "gpu0" not in text and "VRAM in use" not in text
    assert "a CPU is never placed by gpu or VRAM" in text


def test_a_declared_4090_is_listed_as_what_it_measured(owner_client, machine):
    device = machine.devices.get()
    text = page(owner_client, machine)
    assert "gpu0 · NVIDIA GeForce RTX 4090 · 24 GB VRAM" in text
    assert "placed by gpu or VRAM once its jobs are measured" in text
    device_measured(device, tokens_per_s=60)
    text = page(owner_client, machine)
    assert "measured like slower than every GPU class (a CPU's speed)" in text
    assert "60 tokens/s" in text
    assert "not placed by gpu or VRAM" in text
    assert "below the 250 tokens/s of a RTX 4090" in text
    device_measured(device, tokens_per_s=400, jobs=4)
    text = page(owner_client, machine)
    assert "measured like a top-end GPU (H200, H100, A100, …)" in text
    assert "placed as RTX 4090" in text and "24576 MiB credited" in text
