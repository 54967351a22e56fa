"""Bounds on what a host declares (issue 23, item 6), on the real ASGI app: devices
per machine and slots per device (settings), benchmark and failed-capability rows
per device and model; devices missing from the latest ``hello`` retired (kept,
never eligible nor rentable, back with a hello that declares them); frames about
devices the hello did not declare refused with an ``error`` frame."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient

from hosts.models import Benchmark, Device, DeviceModel, FailedCapability
from tests.hostsim import MODEL, HostSim
from tests.jobs.helpers import heartbeat_applied

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def _hello(host: HostSim, indexes, *, agent_version: str = "sim-1") -> dict:
    return {
        "type": "hello",
        "agent_version": agent_version,
        "engine": {"name": "scripted", "version": "1"},
        "public_key": host.public_key,
        "proof": host.proof(),  # the connection's challenge, signed
        "accepts_serverless": True,
        "devices": [
            {"index": i, "name": f"Sim GPU {i}", "vram_total_mb": 24576}
            for i in indexes
        ],
    }


def _heartbeat(indexes, *, slots: int = 1) -> dict:
    return {
        "type": "heartbeat",
        "paused": False,
        "devices": [
            {
                "index": i,
                "temp_c": 50.0,
                "vram_free_mb": 8000,
                "loaded_models": [MODEL],
                "slots": slots,
            }
            for i in indexes
        ],
    }


async def _connect(token: str, indexes, *, key_of: HostSim | None = None, **kw):
    """A host connected with a hello declaring ``indexes``; returns (host, reply)."""
    host = HostSim(token)
    if key_of is not None:
        host.key = key_of.key
    await host.connect(hello=False)
    await host.send(_hello(host, indexes, **kw))
    return host, await host.recv()


async def _loaded_again(device_id: int, timeout: float = 5.0) -> None:
    """Wait until the device's heartbeat is stored (its model loaded): a state,
    polled, not a sleep."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await DeviceModel.objects.filter(device_id=device_id, loaded=True).aexists():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"device {device_id}'s heartbeat was never stored")


async def _listed(api_key: str) -> set[str]:
    response = await AsyncClient().get(
        "/v1/devices", headers={"authorization": f"Bearer {api_key}"}
    )
    return {d["label"] for d in json.loads(response.content)["data"]}


async def test_it_refuses_more_devices_or_slots_than_the_settings_allow(
    catalog, machine_token, settings
):
    settings.BALLAST_MAX_DEVICES_PER_MACHINE = 2
    settings.BALLAST_MAX_SLOTS_PER_DEVICE = 4
    machine, token = await database_sync_to_async(machine_token)("rig")
    host, reply = await _connect(token, [0, 1, 2])
    assert reply["type"] == "error" and "1 to 2 devices" in reply["message"]
    await host.send(_hello(host, [0, 5]))
    reply = await host.recv()
    assert reply["type"] == "error"
    assert "BALLAST_MAX_DEVICES_PER_MACHINE" in reply["message"]
    assert not await Device.objects.filter(machine=machine).aexists()
    await host.send(_hello(host, [0, 1]))
    assert (await host.recv())["type"] == "welcome"
    await host.send(_heartbeat([0], slots=5))
    reply = await host.recv()
    assert (
        reply["type"] == "error" and "BALLAST_MAX_SLOTS_PER_DEVICE" in reply["message"]
    )
    await host.send(_heartbeat([0], slots=4))
    await heartbeat_applied(machine, slots=4)
    await host.close()


@pytest.mark.parametrize(
    "frame",
    [
        _heartbeat([0, 3]),
        {
            "type": "benchmark",
            "device": 3,
            "model": MODEL,
            "tokens_per_s": 10,
            "ttft_ms": 1,
        },
        {"type": "model_load_failed", "device": 3, "model": MODEL, "error": "x"},
    ],
    ids=["heartbeat", "benchmark", "model_load_failed"],
)
async def test_frames_about_a_device_not_in_the_hello_get_an_error(
    catalog, machine_token, frame
):
    machine, token = await database_sync_to_async(machine_token)("rig")
    host, welcome = await _connect(token, [0])
    assert welcome["type"] == "welcome"
    await host.send(frame)
    error = await host.recv()
    assert error["type"] == "error"
    assert error["message"] == (
        f"{frame['type']}: device 3 was not declared in this connection's hello"
    )
    assert not await Benchmark.objects.aexists()
    assert not await FailedCapability.objects.aexists()
    assert not await DeviceModel.objects.aexists(), "nothing of the frame was kept"
    await host.send(_heartbeat([0]))  # the connection goes on
    await heartbeat_applied(machine)
    await host.close()


async def test_devices_missing_from_the_latest_hello_are_retired_until_declared_again(
    catalog, machine_token, api_key
):
    machine, token = await database_sync_to_async(machine_token)("rig")
    first, _ = await _connect(token, [0, 1])
    await first.send(_heartbeat([0, 1]))
    await heartbeat_applied(machine)
    assert await _listed(api_key) == {"rig/gpu0", "rig/gpu1"}

    second, welcome = await _connect(token, [0], key_of=first)  # gpu1 taken out
    assert welcome["type"] == "welcome"
    await second.send(_heartbeat([0]))
    retired = await Device.objects.aget(machine=machine, index=1)
    assert retired.retired_at is not None and retired.slots_total == 0
    assert not await DeviceModel.objects.filter(device=retired, loaded=True).aexists()
    assert await _listed(api_key) == {"rig/gpu0"}, "a retired device is not offered"
    response = await AsyncClient().post(
        "/v1/rentals",
        data={"device": retired.id, "hours": 1},
        content_type="application/json",
        headers={"authorization": f"Bearer {api_key}"},
    )
    assert response.status_code == 404, "nor rentable"
    await second.send(_heartbeat([0, 1]))
    assert "device 1 was not declared" in (await second.recv_type("error"))["message"]

    await Device.objects.filter(id=retired.id).aupdate(
        spot_check_due_at=None, spot_check_reason=""
    )
    third, _ = await _connect(token, [0, 1], key_of=first)  # put back
    await third.send(_heartbeat([0, 1]))
    await _loaded_again(retired.id)
    back = await Device.objects.aget(id=retired.id)
    assert back.retired_at is None and back.slots_total == 1
    assert back.spot_check_reason == "return", "a returning device is checked again"
    assert await Device.objects.filter(machine=machine).acount() == 2, "no new rows"
    for host in (first, second, third):
        await host.close()


async def test_failed_loads_are_kept_for_the_latest_builds_only(catalog, machine_token):
    machine, token = await database_sync_to_async(machine_token)("rig")
    host = None
    for build in range(8):
        previous = host
        host, welcome = await _connect(
            token, [0], key_of=previous, agent_version=f"sim-{build}"
        )
        assert welcome["type"] == "welcome"
        await host.send(
            {"type": "model_load_failed", "device": 0, "model": MODEL, "error": "oom"}
        )
        await host.send({"type": "nonsense"})  # handled in order: the report first
        await host.recv_type("error")
    builds = [
        b
        async for b in FailedCapability.objects.filter(machine=machine).values_list(
            "build", flat=True
        )
    ]
    assert len(builds) == 5 and not any("sim-0" in b for b in builds)
    await host.close()
