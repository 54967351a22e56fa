"""Bring a machine's device 0 online through the real services, as its agent would
(one ``hello``, one heartbeat), without a websocket."""

from __future__ import annotations

from django.utils import timezone

from hosts.models import Device, OnlineSpan
from hosts.services import device_speed_record, machine_heartbeat, machine_hello

MODEL = "smollm2-135m-instruct"


def device_online(
    machine,
    *,
    gpu: str = "NVIDIA GeForce RTX 4090",
    kind: str = "gpu",
    vram_total_mb: int = 24576,
    accepts_serverless: bool = True,
    public_key: str = "A" * 43 + "=",
    models=(MODEL,),
    temp_c: float | None = 50.0,
    vram_free_mb: int = 8000,
    slots: int = 1,
    paused: bool = False,
    agent_version: str = "test",
    engine: tuple[str, str] = ("scripted", "1"),
    features=(),
    verifies: bool = False,
    now=None,
) -> Device:
    """Say hello and send one heartbeat for ``machine``; return its device 0.

    Sizes in MiB, temperature in °C (None: a CPU without a sensor); ``kind``:
    what the hello declares device 0 is (``gpu``/``cpu``);
    ``features``: what the hello declares its engine does beyond text;
    ``verifies``: the hello says its engine scores answers (verify offers).
    """
    machine_hello(
        machine_id=str(machine.id),
        channel_name=f"test.{machine.id}!x",
        hello={
            "agent_version": agent_version,
            "engine_name": engine[0],
            "engine_version": engine[1],
            "public_key": public_key,
            "accepts_serverless": accepts_serverless,
            "features": sorted(features),
            "verifies": verifies,
            "devices": [
                {
                    "index": 0,
                    "name": gpu,
                    "kind": kind,
                    "vram_total_mb": vram_total_mb,
                }
            ],
        },
        now=now,
    )
    machine_heartbeat(
        machine_id=str(machine.id),
        heartbeat={
            "paused": paused,
            "devices": [
                {
                    "index": 0,
                    "temp_c": temp_c,
                    "vram_free_mb": vram_free_mb,
                    "loaded_models": list(models),
                    "slots": slots,
                }
            ],
        },
        now=now,
    )
    return Device.objects.select_related("machine").get(machine=machine, index=0)


def device_measured(
    device, *, tokens_per_s: float, jobs: int = 3, model: str = MODEL, now=None
) -> float | None:
    """Record ``jobs`` succeeded jobs of 64 tokens of ``model`` on ``device`` at
    ``tokens_per_s`` (offer to done), as the coordinator measures them
    (``hosts.services.device_speed_record``); returns its measured speed."""
    speed = None
    for _ in range(jobs):
        speed = device_speed_record(
            device_id=device.id,
            model_id=model,
            tokens=64,
            seconds=64 / tokens_per_s,
            now=now or timezone.now(),
        )
    return speed


def machine_online_since(machine, since) -> None:
    """Make ``machine`` (brought online by ``device_online``) count as online
    since ``since`` without a break: its online spans start then (what its
    heartbeats would have recorded had it been online all along)."""
    OnlineSpan.objects.filter(machine_id=machine.id).update(started_at=since)
