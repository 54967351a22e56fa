"""Hosts declare the weights they run (docs/protocol-notes.md 2026-12-07): a
heartbeat's ``devices[].weights`` is checked (``hosts.protocol``), kept per
device and model, written when it changes, and the machine page says in plain
words why a device running other weights gets no work of the model."""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from hosts.models import DeviceModel
from hosts.protocol import FrameError, parse_heartbeat
from hosts.services import (
    HeartbeatMemo,
    heartbeat_changes,
    heartbeat_memo_update,
    machine_heartbeat,
)
from tests.hostsim import MODEL, HostSim
from tests.jobs.helpers import heartbeat_applied

PINNED = "0123456789abcdef" * 4
OTHER = "fedcba9876543210" * 4


def report(weights=None, models=(MODEL,)) -> dict:
    device = {
        "index": 0,
        "temp_c": 50.0,
        "vram_free_mb": 8000,
        "slots": 1,
        "loaded_models": list(models),
    }
    if weights is not None:
        device["weights"] = weights
    return {"type": "heartbeat", "paused": False, "devices": [device]}


def test_it_reads_the_weights_of_each_loaded_model():
    frame = report({MODEL: {"sha256": PINNED, "quantization": "Q4_1"}})
    parsed = parse_heartbeat(frame, known=frozenset({0}))
    assert parsed["devices"][0]["weights"] == {
        MODEL: {"sha256": PINNED, "quantization": "Q4_1"}
    }
    no_quantization = report({MODEL: {"sha256": PINNED}})
    parsed = parse_heartbeat(no_quantization, known=frozenset({0}))
    assert parsed["devices"][0]["weights"][MODEL]["quantization"] == ""


def test_an_agent_that_declares_no_weights_is_still_understood():
    """An agent of before 2026-12-07 sends no ``weights``: {} (nothing declared)."""
    parsed = parse_heartbeat(report(), known=frozenset({0}))
    assert parsed["devices"][0]["weights"] == {}


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (
            [PINNED],
            "heartbeat: devices[0].weights must be an object (model id: weights)",
        ),
        (
            {MODEL: PINNED},
            f"heartbeat: devices[0].weights['{MODEL}'] must be an object",
        ),
        (
            {MODEL: {"sha256": PINNED.upper()}},
            f"heartbeat: devices[0].weights['{MODEL}'].sha256 must be 64 lowercase"
            " hex digits",
        ),
        (
            {MODEL: {"sha256": PINNED[:-1]}},
            f"heartbeat: devices[0].weights['{MODEL}'].sha256 must be 64 lowercase"
            " hex digits",
        ),
        (
            {MODEL: {}},
            f"heartbeat: devices[0].weights['{MODEL}'].sha256 must be 64 lowercase"
            " hex digits",
        ),
        (
            {MODEL: {"sha256": PINNED, "quantization": "Q" * 33}},
            f"heartbeat: devices[0].weights['{MODEL}'].quantization must be at most"
            " 32 characters",
        ),
        (
            {"other-model": {"sha256": PINNED}},
            "heartbeat: devices[0].weights names 'other-model', not in its"
            " loaded_models",
        ),
    ],
    ids=["list", "digest alone", "upper case", "short", "none", "long", "not loaded"],
)
def test_it_refuses_malformed_weights_naming_them(weights, message):
    with pytest.raises(FrameError) as refused:
        parse_heartbeat(report(weights), known=frozenset({0}))
    assert str(refused.value) == message


def test_a_change_of_weights_is_written_at_once(settings):
    """A steady heartbeat writes nothing; one whose weights changed is written
    (eligibility depends on them)."""
    memo, now = HeartbeatMemo(), timezone.now()
    first = parse_heartbeat(
        report({MODEL: {"sha256": PINNED, "quantization": "Q4_1"}}),
        known=frozenset({0}),
    )
    other = parse_heartbeat(
        report({MODEL: {"sha256": OTHER, "quantization": "Q8_0"}}),
        known=frozenset({0}),
    )
    for heartbeat, seconds, written in ((first, 0, 1), (first, 1, 0), (other, 2, 1)):
        at = now + timedelta(seconds=seconds)
        liveness, reports = heartbeat_changes(memo=memo, heartbeat=heartbeat, now=at)
        assert len(reports) == written
        heartbeat_memo_update(
            memo, liveness=liveness, paused=False, reports=reports, now=at
        )


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_host_socket_keeps_what_its_heartbeats_declare(
    catalog, machine_token
):
    machine, token = await database_sync_to_async(machine_token)("rig")
    host = HostSim(token)
    await host.connect()
    await host.send(report({MODEL: {"sha256": PINNED, "quantization": "Q4_1"}}))
    await heartbeat_applied(machine)
    await host.send(report({MODEL: {"sha256": "x"}}))
    error = await host.recv()
    assert error == {
        "type": "error",
        "message": f"heartbeat: devices[0].weights['{MODEL}'].sha256 must be 64"
        " lowercase hex digits",
    }
    row = await DeviceModel.objects.aget(device__machine=machine, model_id=MODEL)
    assert (row.loaded, row.weights_sha256, row.weights_quantization) == (
        True,
        PINNED,
        "Q4_1",
    ), "the malformed heartbeat changed nothing"
    await host.close()


@pytest.mark.django_db
def test_the_machine_page_says_why_a_device_gets_no_work_of_a_model(
    client, owner, live_device, catalog
):
    catalog.weights_sha256, catalog.quantization = PINNED, "Q4_1"
    catalog.save()
    requantized = live_device("requantized")
    machine_heartbeat(
        machine_id=str(requantized.machine_id),
        heartbeat=parse_heartbeat(
            report({MODEL: {"sha256": OTHER, "quantization": "Q8_0"}}),
            known=frozenset({0}),
        ),
    )
    old = live_device("old-agent")
    right = live_device("right")
    machine_heartbeat(
        machine_id=str(right.machine_id),
        heartbeat=parse_heartbeat(
            report({MODEL: {"sha256": PINNED, "quantization": "Q4_1"}}),
            known=frozenset({0}),
        ),
    )
    client.force_login(owner)

    def page(device) -> str:
        return client.get(f"/machines/{device.machine_id}/").content.decode()

    assert (
        "runs other weights than smollm2-135m-instruct: Q8_0, the catalog&#x27;s is"
        " Q4_1: no jobs of it" in page(requantized)
    )
    assert "did not say which weights it runs; update the agent: no jobs of it" in page(
        old
    )
    assert "no jobs of it" not in page(right)
