"""What ``ballast.host.v1`` adds for verification (docs/protocol-notes.md
"Verification"): ``hello.verifies`` stored on the machine, and the ``scores``
envelope checked before anything is judged."""

from __future__ import annotations

import base64

import pytest

from hosts import protocol
from hosts.models import Machine
from hosts.services import machine_create
from tests.devices import device_online

KEY = base64.b64encode(b"k" * 32).decode()


def _hello(**extra) -> dict:
    return {
        "type": "hello",
        "agent_version": "1",
        "engine": {"name": "llamacpp", "version": "1"},
        "public_key": KEY,
        "devices": [{"index": 0, "name": "gpu", "vram_total_mb": 1024}],
        **extra,
    }


def test_a_hello_says_whether_its_engine_verifies():
    assert protocol.parse_hello(_hello(verifies=True))["verifies"] is True
    assert protocol.parse_hello(_hello())["verifies"] is False, "absent: never offered"
    with pytest.raises(protocol.FrameError, match="verifies must be true or false"):
        protocol.parse_hello(_hello(verifies="yes"))


@pytest.mark.django_db
def test_the_latest_hello_decides_whether_a_machine_verifies(catalog):
    machine, _ = machine_create(owner_email="a@example.com", name="a")
    device_online(machine, verifies=True)
    assert Machine.objects.get(id=machine.id).verifies is True
    device_online(machine)
    assert Machine.objects.get(id=machine.id).verifies is False


def _scores(**extra) -> dict:
    frame = {
        "type": "scores",
        "job": "ab" * 16,
        "tokens": [{"rank": 0, "logprob": -0.1, "mean": -0.5, "var": 0.2}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1},
        "receipt": "c2ln",
    }
    frame.update(extra)
    return frame


def test_a_scores_envelope_is_checked():
    parsed = protocol.parse_scores(_scores())
    assert parsed["completion_tokens"] == 1 and parsed["receipt"] == "c2ln"
    bad = [
        (_scores(tokens={}), "tokens"),
        (_scores(usage={"completion_tokens": 2}), "number of tokens"),
        (_scores(usage={}), "completion_tokens"),
        (_scores(receipt=5), "receipt"),
    ]
    for frame, words in bad:
        with pytest.raises(protocol.FrameError, match=words):
            protocol.parse_scores(frame)
