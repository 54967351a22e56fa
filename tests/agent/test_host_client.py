"""The protocol client against a fake coordinator (websockets server on 127.0.0.1):
its session (hello, heartbeats, the challenge, reconnecting and backing off).

An answer's frames: ``test_host_client_answers.py``; offers, cancels and slots:
``test_host_client_jobs.py``.
"""

from __future__ import annotations

import asyncio
import base64

import pytest

from agent import __version__

pytestmark = []

MODEL = "smollm2-135m-instruct"


@pytest.mark.asyncio
async def test_it_says_hello_and_heartbeats(coordinator, agent_start) -> None:
    agent = await agent_start(coordinator, slots=2)
    hello = coordinator.hellos[0]
    assert hello["type"] == "hello"
    assert hello["agent_version"] == __version__
    assert hello["engine"] == {"name": "scripted", "version": __version__}
    assert len(base64.b64decode(hello["public_key"])) == 32
    assert hello["accepts_serverless"] is True
    device = hello["devices"][0]
    assert device["index"] == 0 and isinstance(device["name"], str) and device["name"]
    assert isinstance(device["vram_total_mb"], int) and device["vram_total_mb"] > 0
    assert device["kind"] == agent.telemetry.devices()[0].kind
    assert coordinator.headers[0]["Authorization"] == "Bearer machine-token"
    assert coordinator.headers[0]["Sec-WebSocket-Protocol"] == "ballast.host.v1"
    assert agent.machine_id == "machine-1"

    first = await coordinator.heartbeat()
    assert first["paused"] is False
    [status] = [d for d in first["devices"] if d["index"] == 0]
    assert status["loaded_models"] == [MODEL]
    assert status["slots"] == 2
    assert isinstance(status["vram_free_mb"], int)
    assert status["temp_c"] is None or isinstance(status["temp_c"], (int, float))
    await coordinator.heartbeat()  # and again after heartbeat_interval_s (0.2 s)


@pytest.mark.asyncio
async def test_a_failed_model_load_is_reported_and_not_listed(
    coordinator, agent_start
) -> None:
    await agent_start(coordinator, script={"load_error": "CUDA out of memory"})
    heartbeat = await coordinator.heartbeat()
    assert heartbeat["devices"][0]["loaded_models"] == []
    failed = await coordinator.expect("model_load_failed")
    assert failed == {
        "type": "model_load_failed",
        "device": 0,
        "model": MODEL,
        "error": "CUDA out of memory",
    }


@pytest.mark.asyncio
async def test_it_reconnects_after_the_connection_drops(
    coordinator, agent_start, offer_frame
) -> None:
    """A dropped connection stops the running job; the agent says hello again."""
    await agent_start(coordinator, script={"mode": "claim_then_silent"})
    await coordinator.send(offer_frame("j"))
    await coordinator.expect("claim", job="j")
    await coordinator.ws.close(1012, "restart")
    await asyncio.wait_for(coordinator.disconnected.wait(), 10)
    await asyncio.wait_for(coordinator.connected.wait(), 10)
    assert len(coordinator.hellos) == 2
    assert coordinator.hellos[1]["public_key"] == coordinator.hellos[0]["public_key"]
    await coordinator.send(offer_frame("j2"))  # the slot of the dropped job is free
    await coordinator.expect("claim", job="j2")


@pytest.mark.asyncio
async def test_a_token_refused_after_accept_backs_off(
    agent_start, coordinator_class
) -> None:
    """Close code 4401 before welcome: retries come after growing delays."""
    async with coordinator_class(close_code=4401) as fake:
        await agent_start(fake, wait=False, retry_min_s=0.2, retry_max_s=5)
        times = [await asyncio.wait_for(fake.attempt_times.get(), 10) for _ in range(3)]
        assert times[1] - times[0] >= 0.15  # 0.2 s ± 20 %
        assert times[2] - times[1] >= 0.3  # then 0.4 s ± 20 %


@pytest.mark.asyncio
async def test_an_agent_replaced_by_another_of_its_machine_backs_off(
    agent_start, coordinator_class, caplog
) -> None:
    """Two agents with one machine token replace each other (4409) after every
    welcome: each backs off with a growing delay instead of taking the machine
    back at once (found: ~80 reconnections a second, the coordinator busy)."""
    async with coordinator_class(replace=True) as fake:
        await agent_start(fake, wait=False, retry_min_s=0.2, retry_max_s=5)
        times = [await asyncio.wait_for(fake.attempt_times.get(), 10) for _ in range(3)]
        assert times[1] - times[0] >= 0.15  # 0.2 s ± 20 %
        assert times[2] - times[1] >= 0.3  # then 0.4 s ± 20 %
        assert len(fake.hellos) >= 2  # each time welcomed, then replaced
    assert "another agent connected as this machine" in caplog.text


@pytest.mark.asyncio
async def test_too_many_connections_backs_off(
    agent_start, coordinator_class, caplog
) -> None:
    """Close code 4429 (the machine's or the address's open connections at
    their cap, docs/protocol-notes.md "Access"): retries come after growing
    delays, and the log says why."""
    async with coordinator_class(close_code=4429) as fake:
        await agent_start(fake, wait=False, retry_min_s=0.2, retry_max_s=5)
        times = [await asyncio.wait_for(fake.attempt_times.get(), 10) for _ in range(3)]
        assert times[1] - times[0] >= 0.15  # 0.2 s ± 20 %
        assert times[2] - times[1] >= 0.3  # then 0.4 s ± 20 %
    assert "too many open connections" in caplog.text


@pytest.mark.asyncio
async def test_a_token_refused_by_the_handshake_does_not_spin(
    agent_start, coordinator_class, caplog
) -> None:
    """HTTP 403: the agent logs it, stays up and retries with backoff.

    The library's backoff waits 0-5 s (random) after the first refusal, then
    3.1 s: within 1 s of the first attempt, at most one more comes.
    """
    async with coordinator_class(refuse_http=True) as fake:
        await agent_start(fake, wait=False)
        first = await asyncio.wait_for(fake.attempt_times.get(), 10)
        await asyncio.sleep(1.2)  # an observation window for a negative check
        assert len([t for t in fake.attempts if t - first < 1.0]) <= 2
    assert "refused the machine token (HTTP 403)" in caplog.text


@pytest.mark.asyncio
async def test_it_signs_the_coordinators_challenge_in_its_hello(
    coordinator, agent_start
) -> None:
    from billing.receipts import challenge_verify

    await agent_start(coordinator)
    hello = coordinator.hellos[0]
    assert challenge_verify(
        public_key_b64=hello["public_key"],
        proof_b64=hello["proof"],
        nonce=coordinator.nonces[0],
    )
