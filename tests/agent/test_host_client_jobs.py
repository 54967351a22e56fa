"""The protocol client against a fake coordinator: offers, cancels and slots,
frames it cannot use, and the scripted engine's failures as the coordinator
sees them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.receipts import receipt_verify

from .helpers import assert_receipt


@pytest.mark.asyncio
async def test_cancel_stops_the_stream_and_frees_the_slot(
    coordinator, agent_start, offer_frame
) -> None:
    """After cancel no frame of the job follows; the one slot takes the next offer."""
    await agent_start(
        coordinator,
        slots=1,
        script={"pieces": [f" w{i}" for i in range(200)], "delay_s": 0.02},
    )
    await coordinator.send(offer_frame("long"))
    await coordinator.expect("claim", job="long")
    await coordinator.expect("token", job="long")
    await coordinator.send({"type": "cancel", "job": "long"})
    await coordinator.send(offer_frame("next", params={"max_tokens": 5}))
    while True:  # tokens already in flight before the cancel may still arrive
        frame = await asyncio.wait_for(coordinator.frames.get(), 10)
        if frame["job"] == "next":
            assert frame["type"] == "claim"
            break
        if frame["type"] == "cancelled":  # the answer to the cancel (its receipt)
            continue
        assert frame == {"type": "token", "job": "long", "text": frame["text"]}
    text, done = await coordinator.stream_collect("next")  # no "long" frame in between
    assert text == " w0 w1 w2 w3 w4"
    assert done["finish_reason"] == "length"


@pytest.mark.asyncio
async def test_an_offer_without_a_free_slot_gets_an_error_and_no_claim(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(coordinator, slots=1, script={"mode": "claim_then_silent"})
    await coordinator.send(offer_frame("busy"))
    await coordinator.expect("claim", job="busy")
    await coordinator.send(offer_frame("extra"))
    error = await coordinator.expect("error", job="extra")
    assert "slot" in error["message"]
    await coordinator.send({"type": "cancel", "job": "busy"})
    await coordinator.expect("cancelled", job="busy")  # nothing sent: an empty receipt
    await coordinator.send(offer_frame("after"))
    await coordinator.expect("claim", job="after")


@pytest.mark.asyncio
async def test_two_slots_run_two_jobs_at_once(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(
        coordinator, slots=2, script={"pieces": ["a", "b", "c"], "delay_s": 0.05}
    )
    await coordinator.send(offer_frame("j1"))
    await coordinator.send(offer_frame("j2"))
    done: dict[str, dict[str, Any]] = {}
    texts = {"j1": "", "j2": ""}
    while len(done) < 2:
        frame = await asyncio.wait_for(coordinator.frames.get(), 10)
        if frame["type"] == "token":
            texts[frame["job"]] += frame["text"]
        elif frame["type"] == "done":
            done[frame["job"]] = frame
        else:
            assert frame["type"] == "claim"
    for job in ("j1", "j2"):
        assert texts[job] == "abc"
        assert_receipt(coordinator.hellos[0], job, done[job], "abc")


@pytest.mark.asyncio
async def test_an_offer_for_a_model_not_loaded_gets_an_error(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(coordinator)
    await coordinator.send(offer_frame("j", model="llama-70b"))
    error = await coordinator.expect("error", job="j")
    assert "not loaded" in error["message"]


@pytest.mark.asyncio
async def test_malformed_and_unknown_frames_do_not_crash_the_agent(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(coordinator)
    for junk in ["not json", "[1, 2]", '{"type": 5}', '{"no": "type"}']:
        await coordinator.send(junk)
    await coordinator.send({"type": "bogus", "job": "x"})
    await coordinator.send({"type": "offer"})  # no job id: nothing to answer
    await coordinator.send({"type": "cancel", "job": "unknown"})
    await coordinator.send({"type": "error", "message": "something you did"})
    await coordinator.send(offer_frame("bad-params", params={"max_tokens": "many"}))
    error = await coordinator.expect("error", job="bad-params")
    assert "max_tokens" in error["message"]
    await coordinator.send(offer_frame("no-input", messages=None, prompt=None))
    await coordinator.expect("error", job="no-input")
    await coordinator.send(offer_frame("good"))
    await coordinator.expect("claim", job="good")
    text, _ = await coordinator.stream_collect("good")
    assert text == "The answer is 4."


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ({"mode": "error_before_first"}, ["claim", "error"]),
        ({"mode": "empty_done"}, ["claim", "done"]),
        ({"mode": "error_at", "n": 2}, ["claim", "token", "token", "error"]),
    ],
)
async def test_scripted_failures_reach_the_coordinator(
    coordinator, agent_start, offer_frame, script, expected
) -> None:
    await agent_start(coordinator, script=script)
    await coordinator.send(offer_frame("j"))
    frames = [await coordinator.expect(kind, job="j") for kind in expected]
    if expected[-1] == "done":
        assert frames[-1]["usage"]["completion_tokens"] == 0
        assert_receipt(coordinator.hellos[0], "j", frames[-1], "")


@pytest.mark.asyncio
async def test_stall_at_goes_silent_but_keeps_heartbeating(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(coordinator, script={"mode": "stall_at", "n": 1})
    await coordinator.send(offer_frame("j"))
    await coordinator.expect("claim", job="j")
    await coordinator.expect("token", job="j")
    while not coordinator.heartbeats.empty():
        coordinator.heartbeats.get_nowait()
    await coordinator.heartbeat()
    await coordinator.heartbeat()
    assert coordinator.frames.empty()


@pytest.mark.asyncio
async def test_never_claim_ignores_offers(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(coordinator, script={"mode": "never_claim"})
    await coordinator.send(offer_frame("j"))
    await coordinator.receive_nothing(0.5)


@pytest.mark.asyncio
async def test_inflated_counts_and_bad_receipts_are_what_the_script_says(
    coordinator, agent_start, offer_frame
) -> None:
    await agent_start(
        coordinator, script={"text": "Four.", "inflate_tokens": 50, "bad_receipt": True}
    )
    await coordinator.send(offer_frame("j"))
    await coordinator.expect("claim", job="j")
    text, done = await coordinator.stream_collect("j")
    assert done["usage"]["completion_tokens"] == 50
    hello = coordinator.hellos[0]
    assert not receipt_verify(hello["public_key"], done["receipt"], "j", 50, text)


@pytest.mark.asyncio
async def test_it_answers_a_cancel_with_a_receipt_over_the_text_it_sent(
    coordinator, agent_start, offer_frame
) -> None:
    """``cancelled`` follows the job's last token: usage and a receipt over
    exactly the text of its token frames (docs/protocol-notes.md)."""
    await agent_start(
        coordinator, script={"pieces": [f" w{i}" for i in range(200)], "delay_s": 0.02}
    )
    await coordinator.send(offer_frame("long"))
    await coordinator.expect("claim", job="long")
    sent = [(await coordinator.expect("token", job="long"))["text"]]
    await coordinator.send({"type": "cancel", "job": "long"})
    while True:
        frame = await asyncio.wait_for(coordinator.frames.get(), 10)
        if frame["type"] == "cancelled":
            break
        assert frame["type"] == "token" and frame["job"] == "long"
        sent.append(frame["text"])
    text = "".join(sent)
    tokens = frame["usage"]["completion_tokens"]
    assert 1 <= tokens <= len(text)
    assert receipt_verify(
        coordinator.hellos[0]["public_key"], frame["receipt"], "long", tokens, text
    )
    await coordinator.receive_nothing()
